"""Batches decoded ahead on a thread at ``num_workers=0`` (``wdsloader.stream.ahead``): the
loop's thread only takes finished batches, the thread stays a bounded distance ahead and blocks
otherwise, errors reach the loop, and an abandoned iteration stops the thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.collate import DefaultCollator
from wdsloader.stream.ahead import Ahead

_DEFAULT = DefaultCollator()


@pytest.fixture()
def ds(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, {"train": [40, 30, 26]})
    return root


class Recording:
    """The default collator, noting the thread it runs on and how far ahead of the loop."""

    def __init__(self) -> None:
        self.threads: set[str] = set()
        self.made = 0
        self.taken = 0  # counted by the test's loop
        self.lead = 0

    def __call__(self, samples):
        self.threads.add(threading.current_thread().name)
        self.lead = max(self.lead, self.made - self.taken)
        self.made += 1
        return _DEFAULT(samples)


def _epoch(loader, rec=None):
    out = []
    for batch in loader:
        if rec is not None:
            rec.taken += 1
        out.append((list(batch["__key__"]), batch["vec"].numpy().copy()))
    return out


def test_num_workers_0_decodes_on_a_thread_with_the_same_batches(ds):
    rec = Recording()
    loader = create_loader(ds, "train", batch_size=8, seed=3, collate_fn=rec)
    got = _epoch(loader, rec)
    assert rec.threads == {"wdsloader-ahead"}  # never the loop's thread
    assert rec.lead <= 2  # batch k is made once the loop took batch k - 2
    plain = create_loader(ds, "train", batch_size=8, seed=3, collate_fn=_DEFAULT)
    plain.dataset_obj.decode_ahead = 0
    want = _epoch(plain)
    assert [k for k, _ in got] == [k for k, _ in want] and len(got) == 12
    for (_, a), (_, b) in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert loader.stats["samples"] == 96 and loader.stats["batches"] == 12


def test_a_broken_off_iteration_stops_the_thread_and_resumes_exactly(ds):
    loader = create_loader(ds, "train", batch_size=8, seed=3)
    it = iter(loader)
    first = [list(next(it)["__key__"]) for _ in range(3)]
    state = loader.state_dict()
    assert any(t.name == "wdsloader-ahead" for t in threading.enumerate())
    it.close()
    assert not any(t.name == "wdsloader-ahead" for t in threading.enumerate())
    again = create_loader(ds, "train", batch_size=8, seed=3)
    again.load_state_dict(state)
    rest = [list(b["__key__"]) for b in again]
    everything = [k for b in first + rest for k in b]
    assert sorted(everything) == sorted(set(everything)) and len(everything) == 96


def test_a_decode_error_is_raised_in_the_loop_after_the_batches_before_it(ds):
    calls = []

    def collate(samples):
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise ValueError("collate refused batch 3")
        return _DEFAULT(samples)

    loader = create_loader(ds, "train", batch_size=8, seed=3, collate_fn=collate)
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(ValueError, match="collate refused batch 3"):
        next(it)
    assert set(calls) == {"wdsloader-ahead"}
    assert not any(t.name == "wdsloader-ahead" for t in threading.enumerate())


def test_ahead_blocks_a_bounded_distance_ahead_and_closes_its_source_in_its_thread():
    pulled, taken, closed_in = [0], [0], []
    leads = []

    def source():
        try:
            for i in range(50):
                leads.append(pulled[0] - taken[0])
                pulled[0] += 1
                yield i
        finally:
            closed_in.append(threading.current_thread().name)

    ahead = Ahead(source(), depth=1, name="test")
    got = []
    for item in ahead:
        taken[0] += 1
        got.append(item)
        if len(got) == 20:
            break
    ahead.close()
    assert got == list(range(20))
    # item j is pulled once j - 1 was handed over (depth 1): never more than 2 beyond the loop
    assert max(leads) <= 2
    assert pulled[0] <= 22 and closed_in == ["wdsloader-test"] and not ahead.alive


def test_closing_waits_a_bounded_time_for_a_batch_that_never_ends(monkeypatch, caplog):
    """A read stuck for ever (a server that never answers past every deadline) leaves its
    thread behind with a warning; the consumer's close returns."""
    from wdsloader.stream import ahead as ahead_module

    monkeypatch.setattr(ahead_module, "CLOSE_JOIN_S", 0.05)
    release, closed = threading.Event(), threading.Event()

    def source():
        try:
            yield 1
            release.wait()  # the second batch never ends until the test lets it
            yield 2
        finally:
            closed.set()

    made = ahead_module.made_ahead(source())
    assert next(made) == 1
    with caplog.at_level("WARNING", logger="wdsloader.stream.ahead"):
        made.close()  # returned: before the bound, this waited for ever
    assert "still in a batch" in caplog.text and not closed.is_set()
    release.set()  # the thread finishes its batch and closes its source itself
    assert closed.wait(timeout=60)
