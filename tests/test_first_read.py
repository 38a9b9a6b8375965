"""The first batch of a remote pass: its samples read in few ranged GETs, and no byte twice."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from tests.dataset_factory import write_dataset
from tests.http_server import RangeHTTPServer, http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.io import ShardStore
from wdsloader.plan.coalesce import Runs, coalesce
from wdsloader.stream.first_read import widen


def _ids(keys: list[str]) -> np.ndarray:
    return np.array([int(k[len("train") :]) for k in keys])


def _first_pass(server: RangeHTTPServer, name: str, counts: list[int], batch: int, window: int):
    folder = server.root / name
    manifest = write_dataset(str(folder), {"train": counts})
    kw = dict(batch_size=batch, seed=5, shuffle_window=window, span=10, drop_last=False)
    loader = create_loader(f"{server.url}/{name}", "train", **kw)
    # a window this small would be read whole (as fast either way); over 32 MiB it is not
    assert loader.dataset_obj.reader.first_alone_bytes == 32 << 20
    loader.dataset_obj.reader.first_alone_bytes = 0
    reference = [b["__key__"] for b in create_loader(str(folder), "train", **kw)]
    server.clear_log()
    batches = [b["__key__"] for b in loader]
    assert batches == reference  # the plan is unchanged: only the order of the reads
    keys = sorted(k for b in batches for k in b)
    assert keys == [f"train{i:07d}" for i in range(sum(counts))]  # every sample once
    tars = [r for r in server.requests() if r.path.endswith(".tar")]
    return batches, tars, manifest.split("train").shards, ShardStore(folder)


def test_the_first_batch_over_four_shards_is_a_few_ranged_gets_and_no_byte_is_read_twice(
    http_server,
):
    counts = [150, 150, 150, 150]
    batches, tars, shards, store = _first_pass(http_server, "few", counts, 64, 600)
    # the first batch's 64 samples lie in all four shards, scattered over its window
    ids = _ids(batches[0])
    where = np.searchsorted(np.cumsum(counts), ids, side="right")
    assert sorted(set(where.tolist())) == [0, 1, 2, 3]
    todo = {
        (
            f"/few/{shards[s].path}",
            int(store.index(shards[s])[i]),
            int(store.index(shards[s])[i + 1]),
        )
        for s, i in zip(
            where.tolist(), (ids - np.r_[0, np.cumsum(counts)][where]).tolist(), strict=True
        )
    }
    # the requests sent until every byte of the first batch arrived: a few, not one per sample
    for n, r in enumerate(tars, 1):  # noqa: B007 (n: the count after the loop)
        todo = {t for t in todo if not (t[0] == r.path and r.start <= t[1] and t[2] <= r.stop)}
        if not todo:
            break
    assert not todo and n <= 8, n
    # no byte of a shard requested twice over the pass, and the samples' bytes all read
    seen: dict[str, list[tuple[int, int]]] = {}
    for r in tars:
        seen.setdefault(r.path, []).append((r.start, r.stop))
    for spans in seen.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), spans
    once = sum(int(store.index(s)[-1] - store.index(s)[0]) for s in shards)
    assert sum(r.sent for r in tars) == once


def test_the_rest_of_the_window_reads_around_the_bytes_the_first_read_holds(
    http_server, monkeypatch
):
    # gaps of at most one sample merged: the first read holds parts of the shards only, and
    # the second asks for the rest of its spans, not for the held bytes again
    monkeypatch.setattr("wdsloader.stream.first_read.FIRST_MAX_GAP", 1)
    counts = [200, 200]
    batches, tars, shards, store = _first_pass(http_server, "part", counts, 32, 400)
    spans = sorted((r.path, r.start, r.stop) for r in tars)
    for a, b in pairwise(spans):
        assert a[0] != b[0] or a[2] <= b[1], (a, b)
    once = sum(int(store.index(s)[-1] - store.index(s)[0]) for s in shards)
    assert sum(r.sent for r in tars) == once


def _runs(key, start, stop) -> Runs:
    return coalesce(key, start, stop)


def test_widen_merges_the_smallest_gaps_of_a_shard_first_within_the_budget():
    # shard 0: ranges with gaps 5, 1, 3 between them; shard 1: one range after shard 0's end
    runs = _runs([0, 0, 0, 0, 1], [0, 15, 26, 39, 0], [10, 25, 36, 49, 4])
    same = widen(runs, max_gap=10, budget=0)
    assert same.start.tolist() == runs.start.tolist()
    one = widen(runs, max_gap=10, budget=1)  # the gap of 1 only
    assert list(zip(one.key.tolist(), one.start.tolist(), one.stop.tolist(), strict=True)) == [
        (0, 0, 10),
        (0, 15, 36),
        (0, 39, 49),
        (1, 0, 4),
    ]
    assert one.run_of.tolist() == [0, 1, 1, 2, 3]
    two = widen(runs, max_gap=4, budget=100)  # the gap of 5 is over max_gap
    assert list(zip(two.start.tolist(), two.stop.tolist(), strict=True)) == [
        (0, 10),
        (15, 49),
        (0, 4),
    ]
    every = widen(runs, max_gap=10, budget=9)
    assert list(
        zip(every.key.tolist(), every.start.tolist(), every.stop.tolist(), strict=True)
    ) == [
        (0, 0, 49),
        (1, 0, 4),
    ]
    assert every.run_of.tolist() == [0, 0, 0, 0, 1]
