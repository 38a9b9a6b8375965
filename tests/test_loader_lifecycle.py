"""What a loader leaves behind: no file descriptors after it is done or collected, a clean
interpreter exit with an iterator still open, and one error type when a worker dies."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading

import pytest

from tests.dataset_factory import write_dataset
from tests.exit_check import assert_exits_cleanly
from wdsloader import WorkerDiedError, create_loader
from wdsloader.collate import DefaultCollator
from wdsloader.stream.collected import closed_so_far

COUNTS = [5] * 12  # one descriptor per shard leaked before


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settle() -> None:
    """Collect, let the read-ahead threads of finished iterations end (they close the
    store's files when their last read is over) and the stores of collected datasets close."""
    gc.collect()
    for t in threading.enumerate():
        if t.name.startswith("wdsloader-read"):
            t.join()
    assert closed_so_far(timeout=60)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_loaders_iterated_to_the_end_and_deleted_keep_no_descriptors(ds):
    list(create_loader(ds, "train", batch_size=4))  # warm up (imports, caches)
    settle()
    before = open_fds()
    for _ in range(10):
        loader = create_loader(ds, "train", batch_size=4, num_workers=0)
        assert len(list(loader)) == len(loader)
        del loader
    settle()
    assert open_fds() <= before  # other tests' leftovers may close meanwhile; a leak grows it


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_iteration_broken_off_early_keeps_no_descriptors(ds):
    settle()
    before = open_fds()
    for _ in range(10):
        loader = create_loader(ds, "train", batch_size=4, num_workers=0, shuffle=True)
        own = open_fds()  # the loader's shared-memory control block
        it = iter(loader)
        next(it)
        del it
        settle()
        assert open_fds() <= own  # the loader lives on, its shards' files are closed (<=: earlier
        # tests' leftovers may be collected meanwhile; a leak only grows the count)
        loader.dataset_obj.peek_batch()  # reads outside an iteration: the finalizer closes
        del loader
    settle()
    assert open_fds() <= before  # other tests' leftovers may close meanwhile; a leak grows it


def test_a_dataset_collected_inside_its_stores_pool_closes_the_store_without_a_deadlock(ds):
    """A read thread left over from an iteration that raised was inside ``submit`` on its
    store's pool (which holds the pool's lock and the executors' global one) when a collection
    there found the dataset gone; its finalizer closed the store in that thread, waited for
    that lock for ever, and every thread pool of the process with it (a hung CI run)."""
    holder = [create_loader(ds, "train", batch_size=4, num_workers=0)]
    store = holder[0].dataset_obj.store
    pool = store._thread_pool(2)  # the pool a remote read or a load of indexes submits to
    collected = threading.Event()

    def collect_inside_submit() -> None:
        with pool._shutdown_lock:  # as ThreadPoolExecutor.submit holds it
            holder.clear()
            gc.collect()  # the loader and its dataset are collected here
            collected.set()

    threading.Thread(target=collect_inside_submit, daemon=True).start()
    assert collected.wait(60), "the finalizer waited for the lock its own thread held"
    assert closed_so_far(timeout=60)
    assert store._pool is None  # closed all the same, on the closer thread


EXIT_SCRIPT = """
from wdsloader import create_loader
loader = create_loader({root!r}, "train", batch_size=2, num_workers={workers})
it = iter(loader)
next(it)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_interpreter_exits_cleanly_with_an_iterator_open(ds, workers):
    assert_exits_cleanly(EXIT_SCRIPT.format(root=ds, workers=workers))


BUSY_EXIT_SCRIPT = """
import torch
from wdsloader import DecodeOptions, create_loader
from wdsloader.collate import DefaultCollator

inner, a = DefaultCollator(), torch.rand(700, 700)

def busy(samples):  # torch's C++ with the GIL released, as a collate on tensors spends its time
    for _ in range(40):
        torch.mm(a, a)
    return inner(samples)

loader = create_loader(
    {root!r}, "train", batch_size=2, num_workers=0, decode=DecodeOptions(gather=False),
    collate_fn=busy,
)
it = iter(loader)
next(it)  # the exit comes while the thread ahead is inside torch.mm for the next batch
"""


def test_interpreter_exits_cleanly_while_the_thread_ahead_is_in_torch(ds):
    """A daemon thread frozen by the interpreter's finalization inside torch's C++ code aborted
    the process ("terminate called without an active exception", exit status -6)."""
    assert_exits_cleanly(BUSY_EXIT_SCRIPT.format(root=ds))


STOP_SCRIPT = """
import gc
from wdsloader.stream.exit_stop import EXIT_JOIN_S, forget, stop_at_exit

class Iteration:
    def __init__(self, name):
        self.name = name
    def close(self, timeout=None):
        print(self.name, timeout == EXIT_JOIN_S, flush=True)

kept, closed, collected = Iteration("kept"), Iteration("closed"), Iteration("collected")
for it in (kept, closed, collected):
    stop_at_exit(it)
forget(closed)
del collected, it
gc.collect()
"""


def test_iterations_still_open_at_exit_are_closed_with_the_exit_timeout():
    """One hook for the thread ahead and the thread workers: each iteration still registered
    is closed once, with the exit timeout; one closed or collected before is left alone."""
    assert assert_exits_cleanly(STOP_SCRIPT).split() == ["kept", "True"]


class KillOnKey:
    """A collator (picklable, for workers) whose process kills itself on a chosen sample."""

    def __init__(self, key: str, how: str = "kill") -> None:
        self.key = key
        self.how = how
        self.inner = DefaultCollator()

    def __call__(self, samples):
        if any(s["__key__"] == self.key for s in samples):
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return self.inner(samples)


DIED = r"DataLoader worker [01] \(pid \d+\) of rank 0 died \({how}\)"


@pytest.mark.parametrize(
    ("position", "how", "text"),
    [
        (0, "kill", "killed by signal SIGKILL"),  # the first sample of the epoch
        (29, "kill", "killed by signal SIGKILL"),  # mid-epoch, in the middle of a shard
        (59, "kill", "killed by signal SIGKILL"),  # the last sample
        (33, "exit", "exit code 3"),
    ],
)
def test_a_dead_worker_is_one_error_naming_worker_pid_and_shard(ds, position, how, text):
    loader = create_loader(
        ds,
        "train",
        batch_size=2,
        num_workers=2,
        shuffle=False,
        gather=False,  # every batch goes through the collator
        collate_fn=KillOnKey(f"train{position:07d}", how),
    )
    shard = position // 5
    with pytest.raises(
        WorkerDiedError, match=DIED.format(how=text) + rf" while reading train/shard-{shard:06d}"
    ) as info:
        list(loader)
    assert isinstance(info.value, RuntimeError)
    assert "loader.load_state_dict(loader.state_dict())" in str(info.value)


@pytest.mark.parametrize("after", [1, 5, 12])
def test_a_worker_killed_from_the_main_process_is_the_same_error(ds, after):
    loader = create_loader(ds, "train", batch_size=2, num_workers=2, shuffle=False)
    before = {p.pid for p in multiprocessing.active_children()}
    it = iter(loader)
    for _ in range(after):
        next(it)
    victim = min({p.pid for p in multiprocessing.active_children()} - before)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match=DIED.format(how="killed by signal SIGKILL")) as info:
        for _ in it:
            pass
    assert f"(pid {victim})" in str(info.value)
