"""The bounded shard cache under races between the readers of a node, driven step by step in one
process (each reader its own ShardCache on the same folder; the room lock is an ``flock``, so it
excludes them as it excludes processes): events order the steps, no sleeps."""

from __future__ import annotations

import os
import threading

import pytest

from wdsloader.format import ShardInfo
from wdsloader.io import shard_cache
from wdsloader.io.cache_ledger import cache_usage
from wdsloader.io.shard_cache import OpenFiles, ShardCache

SIZE = 4096
URL = "s3://bucket/ds/train"


def _shard(i: int) -> ShardInfo:
    name = f"shard-{i:06d}.tar"
    return ShardInfo(path=name, idx_path=f"{name}.idx", num_samples=1, num_bytes=SIZE)


def _cache(folder, limit: int, fill=None) -> ShardCache:
    def write_all(files):
        for _, fd in files:
            shard_cache.pwrite_all(fd, b"x" * SIZE, 0)

    return ShardCache(
        str(folder), limit, files=OpenFiles(16), count=lambda name, n: None,
        fill=fill or write_all, check=lambda shard, path, fd: None,
    )  # fmt: skip


def _item(cache: ShardCache, i: int) -> tuple[ShardInfo, str]:
    return _shard(i), cache.path(f"{URL}/{_shard(i).path}", _shard(i))


def _folder_bytes(folder) -> int:
    return sum(
        p.stat().st_size for p in folder.iterdir() if p.name.startswith(("wds-", ".wds-tmp"))
    )


def test_a_download_finished_during_another_readers_scan_is_counted(tmp_path, monkeypatch):
    """Reader b makes room while reader a's download ends: a's file, listed by b's scan as a
    temporary file, is renamed before b reads its size. Counted nowhere, b would think there was
    room for one more shard than there is (a CI run saw the folder 1 shard over its limit)."""
    folder, limit = tmp_path / "cache", 3 * SIZE
    filling, go, step = threading.Event(), threading.Event(), threading.Event()

    def slow_fill(files):  # a's download: its bytes arrive once b's scan has listed the folder
        filling.set()
        go.wait()
        for _, fd in files:
            shard_cache.pwrite_all(fd, b"x" * SIZE, 0)

    a, b = _cache(folder, limit, slow_fill), _cache(folder, limit)
    for i in (0, 1):
        assert b.download([_item(b, i)], set())
    thread_a = threading.Thread(target=a.download, args=([_item(a, 2)], set()))
    thread_a.start()
    assert filling.wait(60)

    real_scandir, real_replace, real_lock = os.scandir, os.replace, shard_cache.space_lock

    class Listing(list):
        def __enter__(self):
            return iter(self)

        def __exit__(self, *exc):
            return False

    def scandir(path):  # lists, lets a finish its download, then b reads the sizes
        entries = Listing(real_scandir(path))
        if str(path) == str(folder) and not go.is_set():
            assert any(e.name.startswith(".wds-tmp-") for e in entries)
            go.set()
            assert step.wait(60)  # a renamed its file, or waits for the room lock to do so
        return entries

    def replace(src, dst):
        real_replace(src, dst)
        if go.is_set():
            step.set()

    def space_lock(cache_dir):
        if go.is_set():
            step.set()
        return real_lock(cache_dir)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shard_cache, "space_lock", space_lock)
    assert b.download([_item(b, 3)], set())
    thread_a.join(60)
    assert not thread_a.is_alive()
    monkeypatch.undo()
    assert _folder_bytes(folder) <= limit  # 4 shards before the fix: a's was counted nowhere
    assert cache_usage(str(folder))["peak"] <= limit
    assert os.path.exists(_item(a, 2)[1]) and os.path.exists(_item(b, 3)[1])


@pytest.mark.parametrize("renamed", [True, False])
def test_held_counts_a_file_listed_under_both_names_once(tmp_path, monkeypatch, renamed):
    """tests/test_remote_bytes.py's measure of the folder: a file a scan meets under its
    temporary name and then its final name (renamed in between) holds its bytes once."""
    from tests.test_remote_bytes import _held

    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "wds-0123456789abcdef01234567-shard-000000.tar").write_bytes(b"x" * SIZE)
    tmp = folder / ".wds-tmp-1-abc"
    tmp.write_bytes(b"y" * SIZE)
    real_scandir = os.scandir

    class Listing:
        def __init__(self, path):
            self.path = path

        def __enter__(self):
            return self._entries()

        def __exit__(self, *exc):
            return False

        def _entries(self):
            first = {e.name: e for e in real_scandir(self.path)}
            yield first[tmp.name]  # its size read under the temporary name
            final = folder / "wds-89abcdef0123456789abcdef-shard-000001.tar"
            if renamed:
                tmp.rename(final)
            yield from (e for e in real_scandir(self.path) if e.name != tmp.name)

    monkeypatch.setattr(os, "scandir", Listing)
    assert _held(folder) == 2 * SIZE


def test_a_shard_evicted_this_epoch_is_not_downloaded_again_by_a_reader_that_starts_later(
    tmp_path,
):
    """Three readers of a node (ShardStores on one folder): ``early`` reads shard 0 and is past
    it; ``other`` needs room, and shard 0, claimed by no live reader, is evicted; ``late`` (a
    rank or worker that started late: its claims came after the eviction) then reads shard 0 in
    the same epoch. Before, it downloaded shard 0 whole a second time (seen under obstore:
    fetched/dataset 1.10); now it reads its ranges. The next epoch caches shard 0 again."""
    from tests.dataset_factory import write_dataset
    from wdsloader.io import ReadOptions, ShardStore

    root = "memory://cache-races-evicted/ds"
    shards = write_dataset(root, {"train": [10, 10, 10]}).split("train").shards
    s0, s1, s2 = shards
    size = max(s.num_bytes for s in shards)
    read = ReadOptions(cache_dir=str(tmp_path / "cache"), cache_limit_bytes=2 * size + 8192)
    early, other, late = (ShardStore(root, read) for _ in range(3))
    want = ShardStore(root, ReadOptions()).read_ranges([(s0, 512, 4096)])
    try:
        early.expect_reads([(s0, 0, 0), (s1, 1, 1)], epoch=0)
        other.expect_reads([(s2, 0, 0)], epoch=0)
        early.read_ranges([(s0, 0, 512)])
        early.reads_done(1)  # past shard 0: nobody claims it now
        early.read_ranges([(s1, 0, 512)])
        other.read_ranges([(s2, 0, 512)])  # no room for 3 shards: shard 0 goes
        assert early.stats["cache_misses"] + other.stats["cache_misses"] == 3
        assert early.stats["evictions"] + other.stats["evictions"] >= 1

        early.reads_done(2)  # past shard 1: room for shard 0 again
        late.expect_reads([(s0, 0, 0)], epoch=0)
        assert late.read_ranges([(s0, 512, 4096)]) == want
        assert late.stats["cache_misses"] == 0, "shard 0 downloaded twice in epoch 0"
        assert late.stats["bytes_fetched"] < size  # its ranges (and its index), not the shard

        other.reads_done(1)  # every pass of epoch 0 is over; epoch 1 caches shard 0 again
        late.expect_reads([(s0, 0, 0)], epoch=1)
        assert late.read_ranges([(s0, 512, 4096)]) == want
        assert late.stats["cache_misses"] == 1
    finally:
        for store in (early, other, late):
            store.close()
