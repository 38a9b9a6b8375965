"""Remote reads tuned from the measured path: the pure rule (given round trips and rates), the
probe that measures it, the store that applies it (explicit options win) and the read-ahead
bounded by its byte budget, counted at the server."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import RangeHTTPServer, http_server_fixture  # noqa: F401
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.io.tuning import UNMEASURED, Probe, Tuning, ahead_budget, tune
from wdsloader.stream.reader import BatchReader

MiB = 2**20


@pytest.mark.parametrize(
    ("rtt", "rate", "size", "inflight", "ahead"),
    [
        # 40 ms, 1 Gbit/s a connection: 16 MiB requests (20 MB wanted), 0.174 s each -> 26
        (0.040, 125e6, 16 * MiB, 26, 256 * MiB),
        # 2 ms: 1 MB wanted -> the 8 MiB floor; 0.069 s each -> 21 in flight, 168 MiB ahead
        (0.002, 125e6, 8 * MiB, 21, 168 * MiB),
        # a near, fast path (0.2 ms, 1 GB/s): few threads, the read-ahead floor
        (0.0002, 1e9, 8 * MiB, 4, 32 * MiB),
        # a far, slow one (100 ms, 10 MB/s): 4 MB wanted -> 8 MiB, 0.94 s each -> the 64 cap
        (0.100, 10e6, 8 * MiB, 64, 256 * MiB),
    ],
)
def test_the_tuning_follows_the_round_trip_and_the_rate(rtt, rate, size, inflight, ahead):
    assert tune(rtt, rate) == Tuning(size, inflight, ahead, rtt, rate)


def test_the_readers_of_a_node_share_its_link_and_memory():
    """40 ms, 1 Gbit/s a connection: one reader alone takes 26 in flight and 256 MiB ahead; 8
    ranks x 8 workers on a node take their share (0.40 requests each -> the 4 floor, 64 MiB
    ahead each), not 64 x 256 MiB = 16 GiB between them."""
    alone = tune(0.040, 125e6)
    shared = tune(0.040, 125e6, readers=64)
    assert (shared.request_bytes, shared.concurrency, shared.readahead_bytes) == (
        16 * MiB, 4, 64 * MiB,
    )  # fmt: skip
    assert (alone.concurrency, alone.readahead_bytes) == (26, 256 * MiB)
    assert tune(0.040, 125e6, readers=2).concurrency == 13  # half of one reader's 26


def test_the_loader_counts_the_nodes_readers_and_workers_keep_the_count(http_server, monkeypatch):
    from wdsloader import Topology, create_loader

    write_dataset(str(http_server.root / "ds"), {"train": [10, 10, 10, 10]})
    root = f"{http_server.url}/ds"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 ranks on this node
    loader = create_loader(root, "train", 4, 2, topology=Topology(rank=1, world_size=8))
    store = loader.dataset_obj.store
    assert store.readers == 4 * 2
    assert pickle.loads(pickle.dumps(store)).readers == 8  # what a worker gets
    alone = create_loader(root, "train", 4, 0)  # one process, no workers: the node's only one
    assert alone.dataset_obj.store.readers == 1


def test_explicit_values_win_and_nothing_measured_means_the_defaults():
    got = tune(0.040, 125e6, request_bytes=MiB, concurrency=3, readahead_bytes=5 * MiB)
    assert (got.request_bytes, got.concurrency, got.readahead_bytes) == (MiB, 3, 5 * MiB)
    # an explicit request size still sets the concurrency: 1 MiB at 40 ms -> 0.048 s each
    assert tune(0.040, 125e6, request_bytes=MiB).concurrency == 64
    assert tune(None, None) == UNMEASURED
    assert tune(0.04, None, concurrency=7) == Tuning(UNMEASURED.request_bytes, 7, 128 * MiB, 0.04)


def test_the_probe_takes_the_round_trip_from_small_requests_and_the_rate_from_large_ones():
    probe = Probe()
    probe.add(4096, 0.050)
    probe.add(800, 0.041)  # the fastest small request is the round trip
    assert (probe.rtt_s, probe.bytes_per_s, probe.measured) == (0.041, None, False)
    probe.add(1 << 20, 0.041 + (1 << 20) / 100e6)
    probe.add(2 << 20, 0.041 + (2 << 20) / 50e6)  # a slower one: the best rate counts
    assert probe.measured and probe.bytes_per_s == pytest.approx(100e6)


@pytest.mark.parametrize(
    ("rtt", "rate"),
    [(math.nan, 1e8), (0.01, math.nan), (math.inf, 1e8), (0.01, math.inf), (0.01, 0.0),
     (-1.0, 1e8)],
)  # fmt: skip
def test_measurements_that_are_not_ones_give_the_unmeasured_tuning(rtt, rate):
    """NaN, infinite, negative or zero measurements: the defaults (NaN/inf raised ValueError or
    OverflowError from the store's tuning)."""
    got = tune(rtt, rate, concurrency=5)
    assert (got.request_bytes, got.concurrency, got.readahead_bytes) == (
        UNMEASURED.request_bytes, 5, UNMEASURED.readahead_bytes,
    )  # fmt: skip


def test_absurd_but_finite_measurements_stay_within_the_bounds():
    got = tune(1e300, 1e300)  # overflowed to inf inside the rules
    assert (got.request_bytes, got.concurrency, got.readahead_bytes) == (16 * MiB, 64, 256 * MiB)
    assert tune(0.0, 1e8).request_bytes == 8 * MiB  # a round trip of 0: the smallest request


def test_the_probe_ignores_requests_without_a_measured_time():
    probe = Probe()
    probe.add(800, 0.0)  # a coarse clock: 0 s (a bulk one raised ZeroDivisionError)
    probe.add(1 << 20, 0.0)
    probe.add(1 << 20, math.nan)
    assert (probe.rtt_s, probe.bytes_per_s) == (None, None)
    probe.add(800, 0.01)
    probe.add(1 << 20, 0.01 + (1 << 20) / 100e6)
    assert probe.bytes_per_s == pytest.approx(100e6)


def _served(server: RangeHTTPServer, counts: list[int], name: str):
    folder = server.root / name
    manifest = write_dataset(str(folder), {"train": counts})
    return f"{server.url}/{name}", manifest, folder


def test_a_store_measures_the_path_and_ships_it_to_workers(http_server):
    url, manifest, _ = _served(http_server, [40, 40], "probe")
    shards = manifest.split("train").shards
    store = ShardStore(url)
    assert store.tuning() == UNMEASURED  # nothing answered yet
    assert store.ship_indexes(shards)
    assert store.tuning().rtt_s is not None  # the index requests gave the round trip
    worker = pickle.loads(pickle.dumps(store))
    assert worker.tuning().rtt_s == store.tuning().rtt_s
    explicit = ShardStore(url, ReadOptions(concurrency=5, max_request_bytes=4096))
    explicit.ship_indexes(shards)
    explicit._probe.add(1 << 20, 0.01)  # measured: the explicit values are kept
    assert (explicit.tuning().concurrency, explicit.tuning().request_bytes) == (5, 4096)
    # and they are what it reads with: a 10 KiB range is 3 requests of at most 4 KiB
    http_server.clear_log()
    explicit.read_ranges([(shards[0], 0, 10240)])
    tars = [r for r in http_server.requests() if r.path.endswith(".tar")]
    assert sorted((r.start, r.stop) for r in tars) == [(0, 4096), (4096, 8192), (8192, 10240)]


@pytest.mark.parametrize("groups_budget", [0, 1, 3])
def test_the_read_ahead_reads_groups_up_to_its_byte_budget(http_server, groups_budget):
    counts = [64] * 8
    url, manifest, folder = _served(http_server, counts, f"ahead{groups_budget}")
    shards = manifest.split("train").shards
    probe = BatchReader(ShardStore(folder), shards, counts, skip_unreadable=False)
    group_bytes = 64 * probe.sample_bytes  # a group: 4 batches of 16 samples
    budget = int(groups_budget * group_bytes) + 1
    store = ShardStore(url, ReadOptions(readahead_bytes=budget))
    reader = BatchReader(store, shards, counts, skip_unreadable=False)
    reader.first_alone_bytes = 1 << 40  # the first window is read whole
    batches = [np.arange(i, i + 16) for i in range(0, sum(counts), 16)]
    http_server.clear_log()
    ahead = reader.read_ahead(batches, 4)
    try:
        assert len(ahead.next_group() or []) == 4
        for future, *_ in list(ahead._pending):
            future.result()  # the reads started: over before counting
        ahead_groups = max(1, groups_budget)  # at least one group ahead of the one handed out
        assert ahead.groups_ahead == ahead_groups
        offsets = [store.index(s) for s in shards]
        want = sum(int(o[-1] - o[0]) for o in offsets[: 1 + ahead_groups])  # 1 shard per group
        tars = [r for r in http_server.requests() if r.path.endswith(".tar")]
        assert sum(r.sent for r in tars) == want
    finally:
        ahead.close()


@pytest.mark.parametrize(
    ("tuned", "group", "readers", "memory", "budget"),
    [
        # unmeasured (128 MiB) and a 64 MiB window of 66.6 MiB: two windows
        (128 * MiB, 66.6 * MiB, 1, 64 << 30, math.ceil(133.2 * MiB)),
        # the tuned budget already holds two groups: kept
        (256 * MiB, 66.6 * MiB, 1, 64 << 30, 256 * MiB),
        # two groups of 200 MiB: at most 256 MiB
        (64 * MiB, 200 * MiB, 1, 64 << 30, 256 * MiB),
        # 64 readers of a 64 GiB node: 1/8 of it between them, 128 MiB each
        (64 * MiB, 100 * MiB, 64, 64 << 30, 128 * MiB),
        # 64 readers of a 16 GiB node: 32 MiB each, less than tuned: the tuned budget
        (64 * MiB, 100 * MiB, 64, 16 << 30, 64 * MiB),
        # memory unknown: the 256 MiB bound only
        (32 * MiB, 100 * MiB, 8, None, 200 * MiB),
    ],
)
def test_a_remote_reader_reads_two_groups_ahead_where_memory_allows(
    tuned, group, readers, memory, budget
):
    assert ahead_budget(tuned, group, readers, memory) == budget


def test_the_readers_budget_holds_two_windows_unless_set(http_server, monkeypatch):
    monkeypatch.setattr("wdsloader.stream.reader.node_memory_bytes", lambda: 64 << 30)
    url, manifest, _ = _served(http_server, [40, 40], "budget")
    shards = manifest.split("train").shards
    reader = BatchReader(ShardStore(url), shards, [40, 40], skip_unreadable=False)
    assert reader.store.tuning() == UNMEASURED  # 128 MiB
    assert reader.readahead_bytes(100 * MiB) == 200 * MiB
    assert reader.readahead_bytes(10 * MiB) == UNMEASURED.readahead_bytes
    explicit = ShardStore(url, ReadOptions(readahead_bytes=5 * MiB))
    assert BatchReader(explicit, shards, [40, 40], False).readahead_bytes(100 * MiB) == 5 * MiB


def test_the_read_ahead_budget_is_documented_as_the_memory_bound():
    doc = ReadOptions.__doc__ or ""
    assert "readahead_bytes" in doc and "Peak memory" in doc
    assert ReadOptions().readahead_bytes is None and ReadOptions().concurrency is None
