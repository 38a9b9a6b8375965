"""Random access by index and key: ``ShardDataset`` gives back exactly the samples the loader
yields, reads only the sample's bytes, and works in a torch DataLoader with any sampler."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from build_shards import ShardOptions, build_shards
from tests.http_server import Faults, http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.access import ShardDataset
from wdsloader.io import ReadOptions

N = 230


def _items():
    return [
        {
            "__key__": f"doc-{i:04d}",
            "emb": np.full(4, i, dtype=np.float32),
            "label": i % 7,
            "meta": {"i": i, "name": "x" * (i % 5)},
            "text": f"sample {i}",
        }
        for i in range(N)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("access") / "ds"
    build_shards(_items(), root, shards=ShardOptions(max_count=50))
    return root


def _loader_samples(root, **kwargs):
    loader = create_loader(
        root, "train", 10, drop_last=False, shuffle=False, collate_fn=list, **kwargs
    )
    return [s for batch in loader for s in batch]


def _same(a, b):
    assert sorted(a) == sorted(b)
    for name, value in a.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, b[name]) and value.dtype == b[name].dtype, name
        else:
            assert value == b[name], name


def test_every_index_gives_the_sample_the_loader_yields(built):
    ds = ShardDataset(built)
    streamed = _loader_samples(built)
    assert len(ds) == len(streamed) == N
    for i, sample in enumerate(streamed):
        got = ds[i]
        assert got["__index__"] == i
        _same(got, sample)  # the loader's sample carries the same __index__
    assert ds[-1]["__key__"] == f"doc-{N - 1:04d}" and ds[-N]["__index__"] == 0
    assert ds[np.int64(7)]["meta"] == {"i": 7, "name": "xx"}


def test_out_of_range_and_wrong_index_types_are_clear(built):
    ds = ShardDataset(built)
    with pytest.raises(
        IndexError, match=r"index 230 out of range for split 'train' \(230 samples\)"
    ):
        ds[N]
    with pytest.raises(IndexError, match="index -231 out of range"):
        ds[-N - 1]
    with pytest.raises(TypeError, match="indexed by an int, got '3'"):
        ds["3"]


def test_get_by_key_reads_the_key_index_not_the_samples(built, caplog):
    ds = ShardDataset(built, fields=["label", "text"])
    with caplog.at_level(logging.INFO, logger="wdsloader.access.dataset"):
        got = ds.get("doc-0123")
    assert got == {"label": 123 % 7, "text": "sample 123", "__key__": "doc-0123", "__index__": 123}
    assert "read the keys" not in caplog.text
    # shards 0-2 looked up: their key indexes; then one sample read (no scan of samples)
    assert ds.store.stats["bytes_read"] == _sample_bytes(ds, 2, 23)
    for i in (0, 49, 50, 229):
        assert ds.get(f"doc-{i:04d}")["__index__"] == i
    with pytest.raises(KeyError, match=r"no sample with key 'doc-9999' in split 'train' of .*ds"):
        ds.get("doc-9999")


def _sample_bytes(ds, shard, pos):
    offsets = ds.store.index(ds.shards[shard])
    return int(offsets[pos + 1] - offsets[pos])


def test_without_key_indexes_the_keys_are_read_once(built, tmp_path, caplog):
    import json
    import shutil

    root = tmp_path / "old"
    shutil.copytree(built, root)
    manifest = json.loads((root / "manifest.json").read_text())
    for shard in manifest["splits"]["train"]["shards"]:
        (root / shard.pop("keys_path")).unlink()
    (root / "manifest.json").write_text(json.dumps(manifest))
    ds = ShardDataset(root, fields=["label", "text"])
    with caplog.at_level(logging.INFO, logger="wdsloader.access.dataset"):
        got = ds.get("doc-0123")
    assert got["__index__"] == 123
    assert caplog.text.count("read the keys of 50 samples") == 3
    for i in (0, 49, 50, 229):
        assert ds.get(f"doc-{i:04d}")["__index__"] == i
    with pytest.raises(KeyError, match=r"no sample with key 'doc-9999' in split 'train' of .*"):
        ds.get("doc-9999")


def test_a_lookup_reads_only_that_samples_bytes(built):
    ds = ShardDataset(built)
    offsets = ds.store.index(ds.shards[2])
    before = ds.store.stats["bytes_read"]
    ds[2 * 50 + 10]
    assert ds.store.stats["bytes_read"] - before == int(offsets[11] - offsets[10])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataloader_with_a_distributed_sampler(built, num_workers):
    ds = ShardDataset(built, fields=["emb", "label"])
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=5)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=num_workers)
        for batch in loader:
            assert torch.equal(batch["emb"][:, 0].long(), batch["__index__"])
            assert torch.equal(batch["label"], batch["__index__"] % 7)
            seen += batch["__index__"].tolist()
    assert sorted(seen) == list(range(N))  # 230 over 2 ranks: no padding needed
    assert pickle.loads(pickle.dumps(ds)).get("doc-0042")["__index__"] == 42


def test_gzip_shards_and_s3(tmp_path, s3_bucket):
    url, options = s3_bucket
    build_shards(_items(), f"{url}/gz", shards=ShardOptions(max_count=60, compression="gzip"),
                 storage_options=options)  # fmt: skip
    ds = ShardDataset(f"{url}/gz", storage_options=options)
    streamed = _loader_samples(f"{url}/gz", storage_options=options)
    for i in (0, 59, 60, 229):
        _same(ds[i], streamed[i])
    assert ds.get("doc-0200")["text"] == "sample 200"
    assert "testing" not in repr(ds)


def test_a_dropped_key_index_read_is_retried_through_the_store(http_server):
    build_shards(_items(), http_server.root / "ds", shards=ShardOptions(max_count=50))
    ds = ShardDataset(f"{http_server.url}/ds", read_options=ReadOptions(backoff=0))
    http_server.faults = Faults(first_gets=1, suffix=".wdskeys")  # the first GET is cut short
    assert ds.get("doc-0042")["__index__"] == 42
    assert ds.get("doc-0229")["text"] == "sample 229"
    keys_gets = [r for r in http_server.requests() if r.path.endswith(".wdskeys")]
    assert [r.dropped for r in keys_gets][:2] == [True, False]
    assert ds.store.stats["retries"] == 1


def test_a_mixed_loaders_source_and_index_give_back_each_sample(built, tmp_path):
    from wdsloader import Mix, MixSource
    from wdsloader.access import MixedShardDataset

    other = [
        {**s, "__key__": f"other-{i:03d}", "label": 100 + i} for i, s in enumerate(_items()[:70])
    ]
    build_shards(other, tmp_path / "b", shards=ShardOptions(max_count=30))
    mix = Mix([MixSource(built, name="a", weight=1), MixSource(tmp_path / "b", name="b", weight=1)])
    ds = MixedShardDataset(mix)
    assert len(ds) == N + 70 and [len(ds.source(n)) for n in ("a", "b")] == [N, 70]
    loader = create_loader(mix, "train", 10, 2, shuffle=True, seed=3, collate_fn=list)
    seen = 0
    for batch in loader:
        for sample in batch:
            again = ds[sample["__source__"], sample["__index__"]]
            _same(again, sample)
            seen += 1
    assert seen == len(loader) * 10
    # a collated batch: its __source__ and __index__ tensors
    batch = next(iter(create_loader(mix, "train", 10, 0, shuffle=True, seed=3)))
    again = ds.batch(batch)
    assert [s["__key__"] for s in again] == list(batch["__key__"])
    assert [s["label"] for s in again] == batch["label"].tolist()
    assert {s["__source__"] for s in again} <= {0, 1}
    # by name, flat and negative indices, keys, errors naming the sources
    assert ds["b", 3]["__key__"] == "other-003" and ds[N + 3]["__key__"] == "other-003"
    assert ds[-1]["__key__"] == "other-069" and ds[-1]["__source__"] == 1
    assert ds.get("other-010")["label"] == 110 and ds.get("doc-0010", "a")["__source__"] == 0
    with pytest.raises(
        KeyError, match=r"no sample with key 'doc-0010' in split 'train' of sources \['b'\]"
    ):
        ds.get("doc-0010", source="b")
    with pytest.raises(KeyError, match=r"no source 'c' in the mix; its sources: \['a', 'b'\]"):
        ds["c", 0]
    with pytest.raises(IndexError, match=r"index 300 out of range for the mix \(300 samples\)"):
        ds[300]


def test_a_mix_on_s3_gives_back_each_batch_and_its_replay(s3_bucket):
    from wdsloader import Mix, MixSource
    from wdsloader.access import MixedShardDataset

    url, options = s3_bucket
    for name, n in (("a", 50), ("b", 30)):
        items = [{**s, "__key__": f"{name}-{i:03d}"} for i, s in enumerate(_items()[:n])]
        build_shards(items, f"{url}/{name}", shards=ShardOptions(max_count=20),
                     storage_options=options)  # fmt: skip
    mix = Mix([MixSource(f"{url}/a", name="a"), MixSource(f"{url}/b", name="b")])
    ds = MixedShardDataset(mix, storage_options=options)
    loader = create_loader(mix, "train", 8, 2, seed=2, storage_options=options, collate_fn=list)
    for step, batch in enumerate(loader):
        again = ds.batch({k: [s[k] for s in batch] for k in ("__source__", "__index__")})
        for sample, read in zip(batch, again, strict=True):
            _same(read, sample)
        replay = loader.batch_indices(0, step)
        assert replay.source.tolist() == [s["__source__"] for s in batch]
        assert replay.index.tolist() == [s["__index__"] for s in batch]
    assert "testing" not in repr(ds)
