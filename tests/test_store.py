"""The storage seam: one registry picks the store of a root (local, cached, remote), every store
(the mix's too) is a :class:`~wdsloader.io.store.Store`, and the choice survives pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import RangeHTTPServer, http_server_fixture  # noqa: F401
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
