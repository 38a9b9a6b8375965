"""Remote groups of batches read back to back: the next group's requests queue behind the
current group's (sent while its last answer is awaited), the first group's requests alone and
first, no store lock held while requests are awaited, and every byte still read once."""

from __future__ import annotations

import threading

import numpy as np

from tests.dataset_factory import write_dataset
from tests.http_server import Faults, RangeHTTPServer, http_server_fixture  # noqa: F401
from wdsloader import PlanOptions, create_loader
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.stream.reader import BatchReader

COUNTS = [64] * 6  # a group of 4 batches of 16 samples: one shard
HOLD_S = 20.0  # the longest a held request waits for the request it waits for (never, passing)


def _served(server: RangeHTTPServer, name: str):
    folder = server.root / name
    manifest = write_dataset(str(folder), {"train": COUNTS})
    return f"{server.url}/{name}", manifest.split("train").shards


def _reader(url: str, shards, **options) -> BatchReader:
    store = ShardStore(url, ReadOptions(**options))
    reader = BatchReader(store, shards, COUNTS, skip_unreadable=False)
    reader.first_alone_bytes = 1 << 40  # groups of 4 batches from the first (one shard each)
    return reader


class Hold:
    """A server hook: the last request of shard ``held`` waits until a request of shard
    ``until`` arrives (at most :data:`HOLD_S`); says whether it came while held."""

    def __init__(self, held: str, held_start: int, until: str) -> None:
        self.held, self.held_start, self.until = held, held_start, until
        self.arrived = threading.Event()
        self.came_while_held: bool | None = None

    def __call__(self, path: str, start: int, stop: int) -> None:
        if path.endswith("/" + self.until):
            self.arrived.set()
        if path.endswith("/" + self.held) and start == self.held_start:
            self.came_while_held = self.arrived.wait(HOLD_S)


def _cut(reader: BatchReader, k: int) -> tuple[int, list[int]]:
    """The request size that cuts shard ``k``'s samples into 4 requests, and their starts."""
    offsets = reader.store.index(reader.shards[k])
    start, stop = int(offsets[0]), int(offsets[-1])
    step = -(-(stop - start) // 4)
    return step, list(range(start, stop, step))


def _tars(server: RangeHTTPServer) -> list:
    return [r for r in server.requests() if r.path.endswith(".tar")]


def test_the_next_groups_requests_are_sent_while_a_groups_last_answer_is_awaited(http_server):
    url, shards = _served(http_server, "overlap")
    step, starts = _cut(_reader(url, shards), 1)  # the shards are alike: 4 requests each
    # a group (a shard) in 4 requests, 2 in flight, every group read ahead (budget)
    reader = _reader(url, shards, concurrency=2, max_request_bytes=step, readahead_bytes=1 << 30)
    hold = Hold(shards[1].path, starts[-1], shards[2].path)  # group 1's last request
    http_server.faults = Faults(hook=hold)
    batches = [np.arange(i, i + 16) for i in range(0, sum(COUNTS), 16)]
    ahead = reader.read_ahead(batches, 4)
    try:
        got = []
        while (group := ahead.next_group()) is not None:
            got.append(np.concatenate([r.shard for r in group]))
    finally:
        ahead.close()
    # group 2's first request reached the server while group 1's last one was still unanswered
    assert hold.came_while_held is True
    assert [sorted(set(g.tolist())) for g in got] == [[k] for k in range(len(COUNTS))]
    # and each group's first request came after the previous group's first one (their order)
    firsts = []
    for r in _tars(http_server):
        k = next(i for i, s in enumerate(shards) if r.path.endswith("/" + s.path))
        if k not in firsts:
            firsts.append(k)
    assert firsts == list(range(len(COUNTS)))


def test_the_first_groups_requests_are_answered_before_the_second_groups_start(http_server):
    url, shards = _served(http_server, "first")
    step, _ = _cut(_reader(url, shards), 0)
    reader = _reader(url, shards, concurrency=4, max_request_bytes=step, readahead_bytes=1 << 30)
    batches = [np.arange(i, i + 16) for i in range(0, sum(COUNTS), 16)]
    ahead = reader.read_ahead(batches, 4)
    try:
        while ahead.next_group() is not None:
            pass
    finally:
        ahead.close()
    tars = _tars(http_server)
    first = [i for i, r in enumerate(tars) if r.path.endswith("/" + shards[0].path)]
    second = [i for i, r in enumerate(tars) if r.path.endswith("/" + shards[1].path)]
    # the first group (the first batch's bytes) read alone: all of it before any of the next
    assert len(first) == 4 and max(first) < min(second)


def test_a_read_is_sent_while_another_read_of_the_store_awaits_its_answer(http_server):
    url, shards = _served(http_server, "lock")
    store = ShardStore(url, ReadOptions(concurrency=2))
    store.load_indexes(shards)
    a, b = (int(store.index(shards[0])[0]), int(store.index(shards[0])[1]))
    hold = Hold(shards[0].path, a, shards[1].path)
    http_server.faults = Faults(hook=hold)
    first = threading.Thread(target=store.read_joined, args=([(shards[0], a, b)],))
    first.start()
    try:
        # the first read is held at the server until this one arrives there: it must not
        # wait for the first one's answer (no lock held across the network wait)
        c, d = (int(store.index(shards[1])[0]), int(store.index(shards[1])[1]))
        (data,) = store.read_ranges([(shards[1], c, d)])
    finally:
        first.join(HOLD_S + 10)
    assert hold.came_while_held is True
    folder = http_server.root / "lock"
    assert data == (folder / shards[1].path).read_bytes()[c:d]


def test_the_pool_is_not_replaced_while_requests_are_queued(http_server):
    url, shards = _served(http_server, "pool")
    store = ShardStore(url, ReadOptions(concurrency=2))
    release = threading.Event()
    futures = store._submit_all(lambda _: release.wait(HOLD_S), range(3))  # 1 queued
    pool = store._pool
    try:
        store.options.concurrency = 4  # tuned anew: a pool of 4 would run 2 more at once
        more = store._submit_all(lambda _: None, range(2))
        assert store._pool is pool and pool is not None and pool._max_workers == 2
    finally:
        release.set()
    for f in futures + more:
        f.result()
    store._submit_all(lambda _: None, range(1))[0].result()
    assert store._pool is not pool and store._pool._max_workers == 4  # resized once idle
    store.close()


def test_a_closed_read_ahead_sends_no_request_of_the_groups_it_had_queued(http_server):
    url, shards = _served(http_server, "close")
    reader = _reader(url, shards, concurrency=1, readahead_bytes=1 << 30)
    store = reader.store
    held = threading.Event()
    release = threading.Event()

    def hook(path: str, start: int, stop: int) -> None:
        if path.endswith("/" + shards[1].path):
            held.set()
            release.wait(HOLD_S)

    http_server.faults = Faults(hook=hook)
    closed = threading.Event()
    close = store.close
    store.close = lambda: (close(), closed.set())  # type: ignore[method-assign]
    batches = [np.arange(i, i + 16) for i in range(0, sum(COUNTS), 16)]
    ahead = reader.read_ahead(batches, 4)
    ahead.next_group()  # group 0; groups 1.. queued behind group 1's request, held
    assert held.wait(HOLD_S)
    ahead.close()
    release.set()
    assert closed.wait(HOLD_S + 10)
    sent = {r.path.rsplit("/", 1)[1] for r in _tars(http_server)}
    assert sent == {shards[0].path.rsplit("/", 1)[1], shards[1].path.rsplit("/", 1)[1]}


def test_a_pass_of_many_windows_reads_every_sample_once_and_every_byte_once(http_server):
    counts = [120, 80, 200, 40, 160]
    folder = http_server.root / "many"
    write_dataset(str(folder), {"train": counts})
    kw = dict(batch_size=16, seed=11, plan=PlanOptions(shuffle_window=64, span=8), drop_last=False)
    reference = [b["__key__"] for b in create_loader(str(folder), "train", **kw)]
    loader = create_loader(f"{http_server.url}/many", "train", **kw)
    loader.dataset_obj.reader.first_alone_bytes = 0  # the first batch read first, then its window
    http_server.clear_log()
    batches = [b["__key__"] for b in loader]
    assert batches == reference  # the same batches in the same order
    store = ShardStore(folder)
    shards = loader.dataset_obj.shards
    once = sum(int(store.index(s)[-1] - store.index(s)[0]) for s in shards)
    assert sum(r.sent for r in _tars(http_server)) == once  # 1.00x: no byte twice


def test_the_groups_of_a_pass_are_read_into_the_readers_reused_buffers(http_server):
    url, shards = _served(http_server, "pooled")
    reader = _reader(url, shards, concurrency=2, readahead_bytes=1 << 30)
    store = ShardStore(str(http_server.root / "pooled"))
    batches = [np.arange(i, i + 16) for i in range(0, sum(COUNTS), 16)]
    ahead = reader.read_ahead(batches, 4)  # 6 groups (one shard each), all read ahead
    try:
        while (group := ahead.next_group()) is not None:
            for raw in group:  # the bytes read are the samples' bytes
                for k, s in enumerate(raw.shard.tolist()):
                    start, stop = store.index(shards[s])[raw.local[k] : raw.local[k] + 2]
                    want = store.read_ranges([(shards[s], int(start), int(stop))])[0]
                    got = raw.buf[raw.start[k] : raw.stop[k]]
                    assert got.tobytes() == want
            del group, raw
    finally:
        ahead.close()
    # a buffer per group in flight, the others leased again once their batches were dropped
    # (a fresh buffer per group faults in every page of each window anew)
    assert reader.pool.allocated + reader.pool.reused == len(COUNTS)
    assert reader.pool.reused >= 1
