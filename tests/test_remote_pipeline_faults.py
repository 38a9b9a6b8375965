"""Pipelined remote reads under hostile conditions: a request queued behind others gets its
whole deadline once it runs; a read error of a later group is raised once, naming the shard
(credentials redacted), before any later batch, and the loader reads again and resumes after
it; an iteration abandoned with requests in flight leaves no thread and no descriptor behind
and the next pass is exact; a stalled server is bounded by the deadline and does not hang a
loader closed during the stall; many small shards with a window larger than the budget."""

from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import Faults, RangeHTTPServer, http_server_fixture  # noqa: F401
from wdsloader import PlanOptions, create_loader
from wdsloader.errors import ShardReadError
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.io import retry as retry_module
from wdsloader.io.request_pool import wait_all
from wdsloader.stream import collected, read_ahead
from wdsloader.stream.reader import BatchReader

COUNTS = [64] * 6  # with a window of 64 samples: a group of 4 batches of 16 per shard
HOLD_S = 20.0  # the longest a held request waits (never, passing)
PASSWORD = "pw-never-shown"
KW = dict(batch_size=16, seed=5, plan=PlanOptions(shuffle_window=64, span=64), drop_last=False)
FAST = dict(retries=1, backoff=0.01, connect_timeout=2.0, read_timeout=2.0, deadline=30.0)


def _dataset(server: RangeHTTPServer, name: str, counts=COUNTS):
    folder = server.root / name
    manifest = write_dataset(str(folder), {"train": counts})
    return str(folder), f"{server.url}/{name}", manifest.split("train").shards


def _keys(loader) -> list[list[str]]:
    return [list(b["__key__"]) for b in loader]


def _shard(key: str) -> int:
    return int(key.removeprefix("train")) // COUNTS[0]  # keys: train{index in the split}


def _ours() -> set[threading.Thread]:
    """The wdsloader threads alive, but the process's one closer of collected stores."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("wdsloader-") and t.name != collected.THREAD_NAME
    }


def _settle(before: set[threading.Thread]) -> set[threading.Thread]:
    """Collect, let the read-ahead threads of abandoned iterations end (the last one closes
    the store), and return the wdsloader threads started since ``before`` still alive."""
    gc.collect()
    for t in _ours() - before:
        if t.name.startswith(("wdsloader-read", "wdsloader-join")):
            t.join(HOLD_S * 3)
    return {t for t in _ours() - before if t.is_alive()}


# -- a queued request's deadline ---------------------------------------------------------------
def test_a_queued_requests_deadline_starts_when_it_is_sent_not_when_it_is_queued(
    http_server, monkeypatch
):
    _, url, shards = _dataset(http_server, "deadline")
    store = ShardStore(url, ReadOptions(concurrency=1, deadline=30.0))
    store.load_indexes(shards)
    made: list[str] = []  # the request whose deadline clock started, in order

    class Logged(retry_module.Deadline):
        def __init__(self, limit):
            super().__init__(limit)
            made.append(current.get(threading.get_ident(), "?"))

    current: dict[int, str] = {}
    fetch = retry_module.RemoteFiles._fetch

    def tagged(self, rel, *args):
        current[threading.get_ident()] = rel
        return fetch(self, rel, *args)

    monkeypatch.setattr(retry_module, "Deadline", Logged)
    monkeypatch.setattr(retry_module.RemoteFiles, "_fetch", tagged)
    arrived, release = threading.Event(), threading.Event()

    def hook(path: str, start: int, stop: int) -> None:
        if path.endswith("/" + shards[0].path):
            arrived.set()
            release.wait(HOLD_S)

    http_server.faults = Faults(hook=hook)
    span = [(s, int(store.index(s)[0]), int(store.index(s)[-1])) for s in shards[:3]]
    first = store.start_joined([span[0]])
    try:
        assert arrived.wait(HOLD_S)
        # two windows queued behind the held one, on the pool's one connection
        later = [store.start_joined([span[1]]), store.start_joined([span[2]])]
        assert store._queued == 3
        assert made == [shards[0].path]  # theirs have not started: nothing to time out
    finally:
        release.set()
    datas = [bytes(r.result()[0]) for r in [first, *later]]
    folder = http_server.root / "deadline"
    assert datas == [(folder / s.path).read_bytes()[a:b] for s, a, b in span]
    assert made == [s.path for s in shards[:3]]
    store.close()


# -- an error in a later group -----------------------------------------------------------------
@pytest.mark.parametrize(
    "fault, first_alone", [("500", True), ("404", True), ("cut", True), ("500", False)]
)
def test_a_later_groups_read_error_is_raised_once_in_order_and_the_loader_resumes(
    http_server, fault, first_alone
):
    """``first_alone``: the first window read at once, else its first batch first (and the
    rest of the window taking the bytes the first read holds)."""
    local, url, shards = _dataset(http_server, f"err{fault}{first_alone}")
    reference = _keys(create_loader(local, "train", **KW))
    bad = shards[2].path  # the 3rd group's shard: read while the earlier ones are decoded
    faults = {
        "500": Faults(suffix=bad, status=500),
        "404": Faults(suffix=bad, status=404),
        "cut": Faults(suffix=bad, first_gets=100),  # every answer cut off mid-body
    }[fault]
    secret_url = url.replace("http://", f"http://bob:{PASSWORD}@")
    loader = create_loader(secret_url, "train", read_options=ReadOptions(**FAST), **KW)
    if not first_alone:
        loader.dataset_obj.reader.first_alone_bytes = 0
    http_server.faults = faults
    got: list[list[str]] = []
    with pytest.raises(Exception) as info:
        for batch in loader:
            got.append(list(batch["__key__"]))
    text = str(info.value)
    port = http_server.url.rsplit(":", 1)[1]
    assert f"http://***@127.0.0.1:{port}/err{fault}{first_alone}/{bad}" in text
    assert PASSWORD not in text and PASSWORD not in repr(info.value)
    assert isinstance(info.value, (ShardReadError, FileNotFoundError)), repr(info.value)
    # every batch before the failing shard's group, in order, and none after it
    failing = next(i for i, b in enumerate(reference) if any(_shard(k) == 2 for k in b))
    assert got == reference[: len(got)] and len(got) == failing
    # the same loader resumes where it stopped, once the storage is back
    state = loader.state_dict()
    http_server.faults = Faults()
    resumed = create_loader(secret_url, "train", read_options=ReadOptions(**FAST), **KW)
    resumed.load_state_dict(state)
    assert _keys(resumed) == reference[len(got) :]
    assert _keys(loader) == reference  # and reads a whole pass again


# -- an iteration abandoned with requests in flight ---------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_iterations_abandoned_mid_epoch_leave_no_thread_or_descriptor_and_resume_exactly(
    http_server,
):
    local, url, _ = _dataset(http_server, "abandon")
    reference = create_loader(local, "train", **KW)
    remote = create_loader(url, "train", read_options=ReadOptions(concurrency=2), **KW)
    before = _ours()
    fds = None
    for k in [1, 3, 5, 2, 7, 1, 4, 6]:  # batches taken before the break: groups in flight
        got = []
        for loader in (reference, remote):
            it = iter(loader)
            got.append([list(next(it)["__key__"]) for _ in range(k)])
            state = loader.state_dict()
            del it
        assert got[0] == got[1]
        assert _settle(before) == set()  # the store closed: its pool's threads are gone
        count = len(os.listdir("/proc/self/fd"))
        fds = count if fds is None else fds
        # the pool's 2 kept-alive connections may open and close in any round (a client and a
        # server socket each, both in this process); a descriptor leaked per round exceeds it
        assert count <= fds + 4
        resumed = create_loader(url, "train", read_options=ReadOptions(concurrency=2), **KW)
        resumed.load_state_dict(state)
        rest = _keys(resumed)
        assert got[1] + rest == _keys(create_loader(local, "train", **KW))
        del resumed
    assert _keys(remote) == _keys(reference)  # the pass after the abandoned ones: exact
    assert _settle(before) == set()


# -- a stalled server --------------------------------------------------------------------------
def test_a_stall_mid_window_is_bounded_by_the_timeouts_and_names_the_shard(http_server):
    local, url, shards = _dataset(http_server, "stall")
    reference = _keys(create_loader(local, "train", **KW))
    bad = shards[1].path
    options = ReadOptions(retries=0, connect_timeout=1.0, read_timeout=1.0, deadline=30.0)
    loader = create_loader(url, "train", read_options=options, **KW)
    http_server.faults = Faults(suffix=bad, stall="answer")
    got = []
    with pytest.raises(ShardReadError, match=f"/stall/{bad}: read failed at byte offset") as e:
        for batch in loader:
            got.append(list(batch["__key__"]))
    assert "timed out" in str(e.value)
    assert got == reference[: len(got)]


def test_a_loader_closed_while_its_server_stalls_returns_and_its_threads_end(http_server):
    _, url, shards = _dataset(http_server, "closing")
    before = _ours()
    # no timeout fires while the test runs: only the server's stop ends the stall
    options = ReadOptions(retries=0, connect_timeout=300.0, read_timeout=300.0, deadline=300.0)
    loader = create_loader(url, "train", read_options=options, **KW)
    arrived = threading.Event()
    http_server.faults = Faults(
        suffix=shards[1].path, stall="answer", hook=lambda *_: arrived.set()
    )
    it = iter(loader)
    next(it)  # the first group read; the second's requests stall at the server
    assert arrived.wait(HOLD_S)
    del it  # the consumer does not wait for the stalled requests
    gc.collect()
    http_server.stop()  # the stall ends: the requests fail, the store closes
    assert _settle(before) == set()


def test_a_pass_started_while_an_abandoned_pass_still_waits_is_not_cut_off_by_its_close(
    http_server, monkeypatch
):
    """The abandoned pass closes the store once its read under way is over: by then the next
    pass's requests are queued on the same store, and they must be answered, not cancelled."""
    local, url, shards = _dataset(http_server, "overlap")
    reference = _keys(create_loader(local, "train", **KW))
    step = -(-shards[0].num_bytes // 8)  # the first group's shard in about 8 requests
    options = ReadOptions(concurrency=1, max_request_bytes=step, deadline=HOLD_S * 3)
    loader = create_loader(url, "train", read_options=options, **KW)
    store = loader.dataset_obj.reader.store
    held, queued, closing = threading.Event(), threading.Event(), threading.Event()
    second_pass = threading.Event()

    def hook(path: str, start: int, stop: int) -> None:
        if path.endswith("/" + shards[1].path) and not second_pass.is_set():
            held.set()  # the abandoned pass's 2nd group: answered once the next pass queued
            queued.wait(HOLD_S)
        elif second_pass.is_set() and not closing.is_set():
            closing.wait(HOLD_S)  # the next pass's first request: answered once the
            # abandoned pass's read-ahead closes (the rest of its requests queued behind)

    submit, closer = store._submit_all, read_ahead._StoreCloser.__call__

    def submit_all(fn, items):
        futures = submit(fn, items)
        if second_pass.is_set():
            queued.set()
        return futures

    def closed(self, future=None) -> None:
        closing.set()
        closer(self, future)

    store._submit_all = submit_all
    monkeypatch.setattr(read_ahead._StoreCloser, "__call__", closed)
    http_server.faults = Faults(hook=hook)
    it = iter(loader)
    first = list(next(it)["__key__"])
    assert held.wait(HOLD_S)
    del it  # abandoned: its 2nd group's request is held at the server
    second_pass.set()
    got = [list(b["__key__"]) for b in loader]
    assert got == reference and first == reference[0][:]


def test_a_read_whose_queued_requests_the_stores_close_cancelled_raises_and_does_not_hang(
    http_server,
):
    """``close`` cancels the requests queued on the store's pool (not run by any thread): the
    read waiting for them gets an error, not a wait without end."""
    _, url, _ = _dataset(http_server, "cancelled")
    store = ShardStore(url, ReadOptions(concurrency=1))
    go = threading.Event()
    running, queued = store._submit_all(lambda _: go.wait(HOLD_S), range(2))
    queued.add_done_callback(lambda _: go.set())  # cancelled by close: the running one ends
    outcome: list[BaseException | None] = []

    def waiter() -> None:
        try:
            wait_all([running, queued])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (what it raises is the test)
            outcome.append(exc)

    store.close()
    assert queued.cancelled() and running.result() is True
    thread = threading.Thread(target=waiter, name="test-waiter", daemon=True)
    thread.start()
    thread.join(HOLD_S * 3)  # never reached, passing: the waiter returns at once
    assert not thread.is_alive(), "wait_all waits for ever for a request cancelled by close"
    assert len(outcome) == 1 and isinstance(outcome[0], CancelledError)


# -- S3, many small shards ----------------------------------------------------------------------
def test_s3_pass_resumed_mid_epoch_gives_the_remaining_batches_exactly_once(
    s3_bucket, s3_transport, tmp_path
):
    url, storage = s3_bucket
    counts = [40, 24, 56, 8, 64, 32]
    write_dataset(str(tmp_path / "ds"), {"train": counts})
    write_dataset(url, {"train": counts}, storage)
    kw = dict(KW, plan=PlanOptions(shuffle_window=48, span=16))
    reference = _keys(create_loader(str(tmp_path / "ds"), "train", **kw))
    options = ReadOptions(storage_options=storage, transport=s3_transport, concurrency=3)
    for k in (1, 4, 9):  # in the first group, at a group's end, further on
        loader = create_loader(url, "train", read_options=options, **kw)
        it = iter(loader)
        head = [list(next(it)["__key__"]) for _ in range(k)]
        state = loader.state_dict()
        del it  # requests of the groups ahead in flight
        resumed = create_loader(url, "train", read_options=options, **kw)
        resumed.load_state_dict(state)
        rest = _keys(resumed)
        assert head + rest == reference
        keys = [key for b in head + rest for key in b]
        assert len(keys) == len(set(keys)) == sum(counts)


def test_hundreds_of_small_shards_with_a_window_larger_than_the_read_ahead_budget(http_server):
    counts = [3] * 160 + [5] * 40  # 680 samples, windows over dozens of shards
    local, url, _ = _dataset(http_server, "small", counts)
    kw = dict(KW, plan=PlanOptions(shuffle_window=256, span=4))
    # (more descriptors than shards: a local group of more shards than max_open_files fails)
    many = ReadOptions(max_open_files=512)
    reference = _keys(create_loader(local, "train", read_options=many, **kw))
    # a budget of one byte: one group ahead only, each group far larger than the budget
    options = ReadOptions(concurrency=4, readahead_bytes=1, max_request_bytes=1 << 12)
    loader = create_loader(url, "train", read_options=options, **kw)
    loader.dataset_obj.reader.first_alone_bytes = 0  # the first batch first, then its window
    got = _keys(loader)
    assert got == reference
    keys = [k for b in got for k in b]
    assert len(keys) == len(set(keys)) == sum(counts)


def test_a_read_ahead_that_failed_to_start_does_not_keep_the_store_open(http_server):
    """The store is closed by the last read-ahead of it to end: one whose start failed counts
    as ended, or no later pass would close the store's files and threads."""
    _, url, shards = _dataset(http_server, "failed")
    reader = BatchReader(ShardStore(url, ReadOptions()), shards, COUNTS, skip_unreadable=False)
    closed = threading.Event()
    close = reader.store.close
    reader.store.close = lambda: (close(), closed.set())  # type: ignore[method-assign]

    def broken():
        raise ValueError("no groups")
        yield

    with pytest.raises(ValueError, match="no groups"):
        read_ahead.ReadAhead(reader, broken(), pipelined=True)
    ahead = read_ahead.ReadAhead(reader, iter([[np.arange(16)]]), pipelined=True)
    (raw,) = ahead.next_group()
    assert len(raw.shard) == 16 and ahead.next_group() is None
    ahead.close()
    assert closed.wait(HOLD_S)  # never reached, passing: closed once its last read is over
