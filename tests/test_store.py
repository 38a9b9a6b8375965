"""The storage seam: one registry picks the store of a root (local, cached, remote), every store
(the mix's too) is a :class:`~wdsloader.io.store.Store`, and the choice survives pickling."""

from __future__ import annotations

import logging
import pickle
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import Faults, RangeHTTPServer, http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest
from wdsloader.io import ReadOptions, ShardStore, Store, open_store
from wdsloader.io.file_store import CachedStore, LocalStore
from wdsloader.io.remote_store import RemoteStore
from wdsloader.io.store import STORES, register_store, store_kind
from wdsloader.mix.store import MixStore


@pytest.mark.parametrize(
    ("root", "cache", "kind", "cls"),
    [
        ("/data/ds", False, "local", LocalStore),
        ("file:///data/ds", True, "local", LocalStore),  # a cache serves remote roots only
        ("s3://bucket/ds", False, "remote", RemoteStore),
        ("https://host/ds", True, "cached", CachedStore),
    ],
)
def test_one_registry_picks_the_store_of_a_root(root, cache, kind, cls, tmp_path):
    options = ReadOptions(cache_dir=str(tmp_path) if cache else None)
    assert store_kind(root, options) == kind
    for store in (ShardStore(root, options), open_store(root, options)):
        assert type(store) is cls and isinstance(store, ShardStore) and isinstance(store, Store)
        assert type(pickle.loads(pickle.dumps(store))) is cls
        assert store.reads_locally == (kind != "remote")


def test_a_local_store_pickles_its_bases_state_and_its_absolute_folder(tmp_path, monkeypatch):
    """A worker unpickles the parent's measurements and shipped indexes (the base's state) and
    reads the same files from another working directory (the relative root made absolute)."""
    m = write_dataset(str(tmp_path / "ds"), {"train": [5]})
    monkeypatch.chdir(tmp_path)
    store = ShardStore("ds")
    store._measured, store.readers = (0.01, 1e9), 3
    shard = m.splits["train"].shards[0]
    reqs = [(shard, 0, 512)]
    state = store.__getstate__()
    assert set(state) == {*ShardStore("s3://bucket/ds").__getstate__(), "_local_base"}
    monkeypatch.chdir(tmp_path.parent)
    clone = pickle.loads(pickle.dumps(store))
    assert (clone._measured, clone.readers) == ((0.01, 1e9), 3)
    assert clone.read_ranges(reqs) == [(tmp_path / "ds" / shard.path).read_bytes()[:512]]


def test_a_registered_store_serves_its_kind(monkeypatch, tmp_path):
    monkeypatch.setitem(STORES, "remote", STORES["remote"])  # restored after the test
    register_store("remote", "tests.test_store:CountingStore")
    store = ShardStore("s3://bucket/ds")
    assert type(store) is CountingStore
    with pytest.raises(ValueError, match="'remote': target 'nowhere' is not"):
        register_store("remote", "nowhere")


class CountingStore(RemoteStore):
    """A store registered in a test."""


def _served(server: RangeHTTPServer, counts: list[int], name: str) -> tuple[str, Manifest, Path]:
    folder = server.root / name
    return f"{server.url}/{name}", write_dataset(str(folder), {"train": counts}), folder


def test_every_store_reads_the_same_bytes_and_a_mix_is_a_store(http_server, tmp_path):
    url, manifest, folder = _served(http_server, [4, 3], "a")
    shards = manifest.split("train").shards
    stores = [
        ShardStore(folder),
        ShardStore(url),
        ShardStore(url, ReadOptions(cache_dir=str(tmp_path / "cache"))),
    ]
    reqs = [(s, int(st.index(s)[1]), int(st.index(s)[3])) for st in stores[:1] for s in shards]
    want = [(folder / s.path).read_bytes()[a:b] for s, a, b in reqs]
    for store in stores:
        assert store.read_ranges(reqs) == want
        joined, pos = store.read_joined(reqs)
        data = bytes(joined)
        assert [data[p : p + b - a] for p, (_, a, b) in zip(pos, reqs, strict=True)] == want
    # a mix of the local and the served copy: each shard read through its own store
    other = list(Manifest.load(str(folder)).split("train").shards)
    mix = MixStore(stores[:2], list(shards) + other, [0] * len(shards) + [1] * len(other))
    assert isinstance(mix, Store) and not mix.reads_locally
    assert mix.url(shards[0]) == str(folder / shards[0].path)
    assert mix.url(other[0]) == f"{url}/{other[0].path}"
    both = [(other[0], a, b) for _, a, b in reqs[:1]] + reqs[1:]
    assert mix.read_ranges(both) == want
    assert np.array_equal(mix.index(other[1]), stores[0].index(shards[1]))


# -- requests the manifest makes unnecessary ------------------------------------------------------
def test_an_index_is_one_ranged_get_with_no_size_request(s3_bucket, caplog):
    url, options = s3_bucket
    manifest = write_dataset(f"{url}/ds", {"train": [5, 6]}, storage_options=options)
    shards = manifest.split("train").shards
    caplog.set_level(logging.INFO, logger="werkzeug")  # moto's access log: one line per request
    store = ShardStore(f"{url}/ds", ReadOptions(storage_options=options))
    assert [len(store.index(s)) for s in shards] == [6, 7]
    lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    assert (
        [re.search(r"(GET|HEAD) \S+", line)[0] for line in lines]
        == [  # type: ignore[index]
            f"GET /{url[5:]}/ds/{s.idx_path}" for s in shards
        ]
    )


def test_a_longer_index_file_is_reported(http_server):
    url, manifest, folder = _served(http_server, [6], "long")
    shard = manifest.split("train").shards[0]
    with open(folder / shard.idx_path, "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(ShardFormatError, match=r"index has more than 56 bytes, expected 56 \(6"):
        ShardStore(url).index(shard)


def test_indexes_are_read_in_parallel_once_per_loader_not_per_worker(http_server):
    counts = [20, 21, 22, 23, 24, 25, 26, 27]
    url, manifest, _ = _served(http_server, counts, "par")
    # the server holds each index GET until four are in flight at once: one after another
    # would break the barrier
    gate = threading.Barrier(4, timeout=20)
    http_server.faults = Faults(suffix=".wdsidx", gate=gate)
    http_server.clear_log()
    loader = create_loader(url, "train", batch_size=8, num_workers=2, drop_last=False, seed=3)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == [f"train{i:07d}" for i in range(sum(counts))]
    index_gets = [r.path for r in http_server.requests() if r.path.endswith(".wdsidx")]
    assert sorted(index_gets) == sorted(
        f"/par/{s.idx_path}" for s in manifest.split("train").shards
    )
    assert not gate.broken
    assert not [r for r in http_server.requests() if r.method == "HEAD"]


def test_the_s3_connection_pool_holds_as_many_requests_as_are_in_flight():
    """s3fs's (botocore's) pool; obstore's client keeps no limit on connections per host."""
    assert ReadOptions().concurrency is None  # derived from the path, up to 64 in flight
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    s3fs = {"transport": "fsspec"}
    store = ShardStore("s3://bucket/ds", ReadOptions(storage_options=options, **s3fs))
    assert store._storage().fs.config_kwargs["max_pool_connections"] == 64
    for concurrency in (24, 64):
        store = ShardStore(
            "s3://bucket/ds",
            ReadOptions(concurrency=concurrency, storage_options=options, **s3fs),
        )
        # botocore's pool (10 connections by default) would queue the requests beyond it
        assert store._storage().fs.config_kwargs["max_pool_connections"] == concurrency
    mine = {**options, "config_kwargs": {"max_pool_connections": 5}}  # the user's choice wins
    store = ShardStore("s3://bucket/ds", ReadOptions(storage_options=mine, **s3fs))
    assert store._storage().fs.config_kwargs["max_pool_connections"] == 5


def test_without_obstore_the_default_transport_reads_s3_through_s3fs_silently(monkeypatch, caplog):
    """``transport="auto"`` (the default) where the s3fast extra is not installed."""
    monkeypatch.setitem(sys.modules, "obstore", None)  # not importable
    assert ReadOptions().transport == "auto"
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    with caplog.at_level(logging.DEBUG, logger="wdsloader"):
        store = ShardStore("s3://bucket/ds", ReadOptions(storage_options=options))
        files = store._storage(data=True).fs
    assert type(files).__name__ == "S3FileSystem"
    assert [r.getMessage() for r in caplog.records] == []


def test_workers_sharing_a_cache_download_each_shard_once(http_server, tmp_path):
    counts = [40, 41, 42, 43]
    url, manifest, _ = _served(http_server, counts, "shared")
    cache = tmp_path / "cache"
    http_server.clear_log()
    kw = dict(batch_size=8, num_workers=2, drop_last=False, seed=2, cache_dir=str(cache))
    keys = [k for batch in create_loader(url, "train", **kw) for k in batch["__key__"]]
    assert sorted(keys) == [f"train{i:07d}" for i in range(sum(counts))]
    # both workers read every shard: one downloads it, the other waits for that copy
    shards = manifest.split("train").shards
    tars = [r for r in http_server.requests() if r.path.endswith(".tar")]
    assert sum(r.sent for r in tars) == sum(s.num_bytes for s in shards)
    assert sorted({r.path for r in tars}) == sorted(f"/shared/{s.path}" for s in shards)


# -- side files (key index, lengths) through the store --------------------------------------------
def test_side_files_are_read_through_every_store_with_its_retries_and_cache(http_server, tmp_path):
    import fsspec

    from build_shards import SampleOptions, ShardOptions, build_shards
    from wdsloader.format.keyindex import decode_key_index
    from wdsloader.format.lengths import read_lengths as read_lengths_fs
    from wdsloader.io.side_files import read_key_index, read_lengths, read_split_lengths

    folder = http_server.root / "side"
    items = [{"__key__": f"k{i:03d}", "ids": np.arange(i % 5 + 1)} for i in range(30)]
    build_shards(
        items, folder, shards=ShardOptions(max_count=12), samples=SampleOptions(lengths="ids")
    )
    url = f"{http_server.url}/side"
    shards = Manifest.load(str(folder)).split("train").shards
    local_fs = fsspec.filesystem("file")
    want_len = [read_lengths_fs(local_fs, str(folder), s).tolist() for s in shards]
    want_keys = [
        decode_key_index((folder / s.keys_path).read_bytes(), s.num_samples) for s in shards
    ]
    assert sorted(n for part in want_len for n in part) == sorted(i % 5 + 1 for i in range(30))
    cache = ReadOptions(cache_dir=str(tmp_path / "cache"), backoff=0)
    local, remote = ShardStore(folder), ShardStore(url, ReadOptions(backoff=0))
    cached = ShardStore(url, cache)
    mix = MixStore([local, remote], list(shards), [1] * len(shards))
    for store in (local, remote, cached, mix):
        assert [read_lengths(store, s).tolist() for s in shards] == want_len, store
        for s, want in zip(shards, want_keys, strict=True):
            assert np.array_equal(read_key_index(store, s), want), store
        assert read_split_lengths(store, shards).tolist() == sum(want_len, [])
    # a dropped connection on a side file is retried (the remote store's retries)
    http_server.faults = Faults(first_gets=2, suffix=".wdskeys")
    fresh = ShardStore(url, ReadOptions(backoff=0))
    assert np.array_equal(read_key_index(fresh, shards[0]), want_keys[0])
    assert np.array_equal(read_key_index(fresh, shards[1]), want_keys[1])
    assert fresh.stats["retries"] == 2
    # the cache keeps side files: a new store on the same cache asks the server for none
    http_server.faults = Faults()
    http_server.clear_log()
    again = ShardStore(url, cache)
    assert [read_lengths(again, s).tolist() for s in shards] == want_len
    assert [r.path for r in http_server.requests()] == []
    # a longer key index is one record too long, a missing one names the file
    with open(folder / shards[0].keys_path, "ab") as f:
        f.write(b"\0" * 12)
    with pytest.raises(ShardFormatError, match=r"\.wdskeys: more than 144 bytes, expected 144 "):
        read_key_index(ShardStore(url), shards[0])
    (folder / shards[1].keys_path).unlink()
    with pytest.raises(ShardFormatError) as err:
        read_key_index(ShardStore(url), shards[1])
    assert str(err.value) == f"{url}/{shards[1].keys_path}: key index file not found"


def test_requests_of_exact_ints_are_not_copied_and_others_become_ints(tmp_path):
    # a request of Python ints is kept as it is (no second tuple per sample alive during a
    # read); numpy bounds are still read as ints, with the same bytes
    manifest = write_dataset(str(tmp_path / "ds"), {"train": [4]})
    shard = manifest.split("train").shards[0]
    store = ShardStore(tmp_path / "ds")
    plain = [(shard, 0, 512), (shard, 1024, 2048)]
    numpy = [(shard, np.int64(0), np.int64(512)), (shard, np.int64(1024), np.int64(2048))]
    reqs, positions, total = store._checked(plain)
    assert all(a is b for a, b in zip(reqs, plain, strict=True))
    assert (positions, total) == ([0, 512], 1536)
    converted, _, _ = store._checked(numpy)
    assert converted == plain and all(type(x) is int for _, a, b in converted for x in (a, b))
    data = (tmp_path / "ds" / shard.path).read_bytes()
    want = [data[0:512], data[1024:2048]]
    assert store.read_ranges(numpy) == store.read_ranges(plain) == want
