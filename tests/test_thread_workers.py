"""Thread workers (``WorkerOptions(mode="thread")``): the batches, their order, resume,
provenance, counters and replay of worker processes; errors raised in the loop as with
processes; no thread left running after a loop stops early; nothing pickled."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.exit_check import assert_exits_cleanly
from tests.shard_edit import header_of, patch_shard
from wdsloader import create_loader
from wdsloader.format import BLOCK
from wdsloader.stream import start_method
from wdsloader.stream.options import WorkerOptions
from wdsloader.stream.threads import THREAD_NAME, start_threads

COUNTS = [37, 23, 41, 9, 30]  # uneven: the workers end at different steps


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


def loader(root, mode, nw, **kw):
    kw.setdefault("batch_size", 4)
    return create_loader(root, "train", num_workers=nw, workers=WorkerOptions(mode=mode), **kw)


def keys(it) -> list[list[str]]:
    return [list(b["__key__"]) for b in it]


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def settle() -> None:
    """Let the read-ahead threads of ended iterations end (they close the store's files once
    their last read is over; a worker thread only asks them to stop)."""
    for t in threading.enumerate():
        if t.name.startswith("wdsloader-read"):
            t.join()


@pytest.mark.parametrize("nw", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_threads_yield_the_batches_of_processes_in_their_order(ds, nw, shuffle):
    kw = {"shuffle": shuffle, "drop_last": False, "seed": 5}
    procs, threads = loader(ds, "process", nw, **kw), loader(ds, "thread", nw, **kw)
    for _epoch in range(2):  # the second epoch: the threads' dataset copies are reused
        want = list(procs)
        got = list(threads)
        assert keys(got) == keys(want)
        assert len(got) == len(threads)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a["__index__"], b["__index__"])
            assert np.array_equal(a["vec"], b["vec"])
    seen = np.concatenate([b["__index__"] for b in got])
    assert sorted(seen.tolist()) == list(range(sum(COUNTS)))  # exactly once
    assert threads.stats == procs.stats
    assert worker_threads() == []


@pytest.mark.parametrize("nw", [2, 3])
@pytest.mark.parametrize(
    ("saved", "resumed", "head_batches"), [("process", "thread", 5), ("thread", "process", 7)]
)
def test_threads_resume_mid_epoch_as_processes_do(ds, nw, saved, resumed, head_batches):
    """A process loader's state resumes a thread loader, and a thread loader's state a process
    loader, with the rest of the epoch."""
    kw = {"shuffle": True, "seed": 3}
    whole = keys(loader(ds, "process", nw, **kw))
    first = loader(ds, saved, nw, **kw)
    it = iter(first)
    head = [list(next(it)["__key__"]) for _ in range(head_batches)]
    state = first.state_dict()
    del it
    again = loader(ds, resumed, nw, **kw)
    again.load_state_dict(state)
    assert head + keys(again) == whole


def test_threads_resume_elastically_onto_another_worker_count(ds):
    kw = {"shuffle": True, "seed": 9}
    saved = loader(ds, "process", 2, **kw)
    it = iter(saved)
    for _ in range(4):
        next(it)
    state = saved.state_dict()
    del it
    procs, threads = loader(ds, "process", 3, **kw), loader(ds, "thread", 3, **kw)
    procs.load_state_dict(state)
    threads.load_state_dict(state)
    assert keys(threads) == keys(procs)


def test_threads_replay_and_metrics(ds):
    threads = loader(ds, "thread", 2, shuffle=True, drop_last=False)
    batches = list(threads)
    for step, batch in enumerate(batches):
        assert np.array_equal(threads.batch_indices(0, step).index, batch["__index__"])
    metrics = threads.metrics()
    assert metrics["batches"] == len(batches)
    assert metrics["samples"] == sum(COUNTS)
    assert metrics["decode_s"] > 0
    assert metrics["bytes_read"] > 0


def _explode(samples):
    raise ValueError(f"collate refused {len(samples)} samples")


def test_a_worker_thread_error_is_raised_as_a_worker_process_error(ds):
    texts = {}
    for mode in ("process", "thread"):
        broken = loader(ds, mode, 2, collate_fn=_explode)
        with pytest.raises(ValueError) as info:
            list(broken)
        texts[mode] = str(info.value)
    assert texts["process"].startswith("Caught ValueError in DataLoader worker process 0.")
    assert texts["thread"].startswith("Caught ValueError in DataLoader worker thread 0.")
    last = {mode: text.rstrip().splitlines()[-1] for mode, text in texts.items()}
    assert last["thread"] == last["process"] == "ValueError: collate refused 4 samples"
    assert worker_threads() == []


def test_a_data_error_names_the_shard_and_sample_as_with_processes(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, {"train": COUNTS})

    def corrupt(data, idx):
        at = header_of(data, idx, 2, "meta.json") + BLOCK
        data[at : at + 4] = b"}}}}"

    shard = patch_shard(root, corrupt)
    errors = {}
    for mode in ("process", "thread"):
        with pytest.raises(Exception) as info:
            list(loader(root, mode, 2, shuffle=False))
        errors[mode] = info
    assert errors["thread"].type is errors["process"].type
    last = {mode: str(e.value).rstrip().splitlines()[-1] for mode, e in errors.items()}
    assert last["thread"] == last["process"]
    assert f"sample #2 of {root}/{shard}" in last["thread"]
    assert "meta" in last["thread"]
    assert isinstance(errors["thread"].value.__cause__, errors["process"].type)


def test_a_loop_that_stops_early_leaves_no_thread_running(ds):
    settle()
    before = {t.ident for t in threading.enumerate()}
    threads = loader(ds, "thread", 3, shuffle=True)
    it = iter(threads)
    next(it)
    assert len(worker_threads()) == 3
    for _ in it:
        break
    del it
    assert worker_threads() == []
    settle()
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before
    assert keys(threads)  # the loader goes on (its next iteration: the next epoch)
    assert worker_threads() == []


EXIT_SCRIPT = """
from wdsloader import create_loader
from wdsloader.stream.options import WorkerOptions
loader = create_loader({root!r}, "train", batch_size=2, num_workers=3,
                       workers=WorkerOptions(mode="thread"))
it = iter(loader)
next(it)
"""


def test_interpreter_exits_cleanly_with_a_thread_iterator_open(ds):
    """Threads left running at exit were frozen inside torch (an abort, about one exit in
    three) and their iterator closed on a torn-down module (an ignored TypeError)."""
    assert_exits_cleanly(EXIT_SCRIPT.format(root=ds), runs=4)


def test_a_close_that_times_out_hands_on_no_copy_a_thread_still_uses(ds):
    """A close given a timeout (at interpreter exit) may return before its threads end: their
    dataset copies are then not handed to the next iteration, which would share them."""
    gate = threading.Event()

    def held(samples):
        gate.wait()
        return len(samples)

    free: list = []
    workers = start_threads(loader(ds, "thread", 2, collate_fn=held).dataset_obj, free, 1)
    workers.close(timeout=0)
    assert free == []
    gate.set()
    for thread in worker_threads():
        thread.join()
    assert free == []
    done = start_threads(loader(ds, "thread", 2).dataset_obj, free, 1)
    done.close(timeout=60)
    assert len(free) == 1 and len(free[0]) == 2  # threads over: the copies go on


def test_threads_need_no_pickling(ds, monkeypatch):
    """A lambda over an unpicklable object collates in threads, where worker processes
    started by spawn refuse it when the loader is made."""
    monkeypatch.setattr(start_method.multiprocessing, "get_start_method", lambda **_: "spawn")
    lock = threading.Lock()

    def count(samples):
        with lock:
            return len(samples)

    with pytest.raises(ValueError, match="the collate_fn cannot be sent to DataLoader workers"):
        loader(ds, "process", 2, collate_fn=count)
    threads = loader(ds, "thread", 2, collate_fn=lambda samples: count(samples))
    assert sum(threads) == sum(COUNTS) - sum(COUNTS) % 4  # train: drop_last


def test_worker_options_check_the_mode():
    with pytest.raises(
        ValueError, match=r"WorkerOptions.mode must be one of \('process', 'thread'"
    ):
        WorkerOptions(mode="threads")
    with pytest.raises(ValueError, match="multiprocessing_context='spawn' would be unused"):
        WorkerOptions(mode="thread", multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="mode='thread' needs num_workers > 0"):
        WorkerOptions(mode="thread").check(0)


def test_threads_mix_sources_as_processes_do(tmp_path):
    from wdsloader.mix import Mix, MixSource

    for name, counts in {"a": [30], "b": [50, 70]}.items():
        write_dataset(str(tmp_path / name), {"train": counts})
    mix = Mix(
        [MixSource(tmp_path / "a", samples=60), MixSource(tmp_path / "b", repeat=1)],
        source_field="__source__",
    )
    got = {}
    for mode in ("process", "thread"):
        mixed = create_loader(
            mix, "train", 8, num_workers=2, seed=4, workers=WorkerOptions(mode=mode)
        )
        batches = [(b["__source__"].tolist(), list(b["__key__"])) for b in mixed]
        got[mode] = (batches, mixed.stats)
    assert got["thread"] == got["process"]
    assert got["thread"][1]["samples/a"] == 60


def test_threads_pack_as_processes_do(tmp_path):
    from tests.test_pack_loader import _build, _loader

    _build(tmp_path / "packed")
    got = {}
    for mode in ("process", "thread"):
        packed = _loader(tmp_path / "packed", num_workers=2, workers=WorkerOptions(mode=mode))
        got[mode] = [(b["input_ids"].tolist(), b["document_ids"].tolist()) for b in packed]
    assert got["thread"] == got["process"]
    assert got["thread"]


def test_close_returns_when_a_thread_fails_closing_its_batches(monkeypatch):
    """A worker whose batches fail to close (an error in their clean-up) after close() made
    room for the batch it was handing over: its error went into the full queue and close()
    waited for it forever. Nothing blocks once close() was called."""
    import queue

    from wdsloader.stream import threads

    blocked = threading.Event()

    class Watched(queue.Queue):
        def put(self, item, block=True, timeout=None):
            if block and self.full():
                blocked.set()  # the worker waits for room
            super().put(item, block, timeout)

    class Source:
        def iter_worker(self, worker):
            try:
                yield from range(100)
            finally:
                raise RuntimeError("clean-up failed")

    monkeypatch.setattr(threads.queue, "Queue", Watched)
    workers = threads.ThreadWorkers(None, [Source()], prefetch=1)  # type: ignore[arg-type, list-item]
    assert next(workers) == 0
    blocked.wait()  # batch 2 waits for room (batch 1 fills the queue)
    closer = threading.Thread(target=workers.close)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive() and worker_threads() == []
