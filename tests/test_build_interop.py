"""Our shards are plain WebDataset: webdataset, HF datasets and GNU tar read them; fsspec outputs."""

from __future__ import annotations

import copy
import subprocess

import numpy as np
import pytest

from build_shards import build_shards
from tests.test_build_core import read_dataset
from wdsloader.format import Manifest
from wdsloader.io.storage import join, url_to_fs

N = 40


def make_items() -> list[dict]:
    rng = np.random.default_rng(1)
    return [
        {
            "__key__": f"q{i:04d}",
            "emb": rng.standard_normal(6).astype(np.float32),
            "negatives": rng.standard_normal((2, 6)).astype(np.float32),
            "text": f"question {i}",
            "label": i % 5,
            "meta": {"i": i, "tags": ["a", "b"][: i % 3], "w": i / 8},
            "raw.bin": bytes([i % 256]) * (i + 1),
        }
        for i in range(N)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop") / "ds"
    manifest = build_shards(
        make_items(), root, splits={"train": 0.75, "val": 0.25}, shard_max_count=7, block_size=16
    )
    return root, manifest, {it["__key__"]: it for it in make_items()}


def _urls(root, manifest, split):
    return [str(root / s.path) for s in manifest.splits[split].shards]


def test_webdataset_reads_every_sample_identically(built):
    wds = pytest.importorskip("webdataset")
    root, manifest, items = built
    for split in ("train", "val"):
        urls = _urls(root, manifest, split)
        assert len(urls) >= 2
        got = list(wds.WebDataset(urls, shardshuffle=False).decode())
        assert len(got) == manifest.splits[split].num_samples
        for s in got:
            src = items[s["__key__"]]
            np.testing.assert_array_equal(s["emb.npy"], src["emb"])
            assert s["emb.npy"].dtype == np.float32
            np.testing.assert_array_equal(s["negatives.npy"], src["negatives"])
            assert s["text.txt"] == src["text"]
            assert s["label.cls"] == src["label"]
            assert s["meta.json"] == src["meta"]
            assert s["raw.bin"] == src["raw.bin"]
    total = sum(manifest.splits[s].num_samples for s in ("train", "val"))
    assert total == N


def test_hf_datasets_webdataset_builder_reads_every_sample_identically(built, tmp_path):
    datasets = pytest.importorskip("datasets")
    root, manifest, items = built
    for split in ("train", "val"):
        ds = datasets.load_dataset(
            "webdataset",
            data_files={split: _urls(root, manifest, split)},
            split=split,
            cache_dir=str(tmp_path / "hf_cache"),
        )
        assert len(ds) == manifest.splits[split].num_samples
        for row in ds:
            src = items[row["__key__"]]
            emb = np.asarray(row["emb.npy"], dtype=np.float32)
            np.testing.assert_array_equal(emb, src["emb"])
            np.testing.assert_array_equal(
                np.asarray(row["negatives.npy"], dtype=np.float32), src["negatives"]
            )
            assert row["text.txt"] == src["text"]
            assert row["label.cls"] == src["label"]
            meta = row["meta.json"]
            assert (meta["i"], meta["tags"], meta["w"]) == (
                src["meta"]["i"],
                src["meta"]["tags"],
                src["meta"]["w"],
            )
            assert row["raw.bin"] == src["raw.bin"]


def test_gnu_tar_lists_the_members(built):
    root, manifest, _items = built
    _, data = read_dataset(root)
    for split, info in manifest.splits.items():
        names = []
        for shard in info.shards:
            out = subprocess.run(
                ["tar", "tf", str(root / shard.path)], capture_output=True, text=True, check=True
            )
            names += out.stdout.split()
        expected = [f"{k}.{ext}" for k, fields in data[split].items() for ext in fields]
        assert sorted(names) == sorted(expected)
        assert names[0].endswith(".emb.npy") and names[1].endswith(".negatives.npy")


def _assert_same_dataset(url, storage_options, local_manifest: Manifest, local_root) -> None:
    remote = Manifest.load(url, storage_options)
    a, b = copy.deepcopy(remote.to_dict()), copy.deepcopy(local_manifest.to_dict())
    a["build"].pop("created"), b["build"].pop("created")
    assert a == b
    fs, base = url_to_fs(url, storage_options)
    for split in remote.splits.values():
        for shard in split.shards:
            assert fs.cat_file(join(base, shard.path)) == (local_root / shard.path).read_bytes()
            assert (
                fs.cat_file(join(base, shard.idx_path))
                == (local_root / shard.idx_path).read_bytes()
            )
    assert not fs.exists(join(base, "_build"))
    read_dataset(url, storage_options)


def test_memory_output_is_byte_identical(built):
    root, manifest, _ = built
    url = "memory://build-interop/ds"
    m = build_shards(
        make_items(), url, splits={"train": 0.75, "val": 0.25}, shard_max_count=7, block_size=16
    )
    assert m.splits["train"].shards[0].sha256 == manifest.splits["train"].shards[0].sha256
    _assert_same_dataset(url, None, manifest, root)
    with pytest.raises(Exception, match="memory:// lives in one process"):
        build_shards(make_items(), "memory://build-interop/ds2", workers=2)


@pytest.mark.slow
def test_s3_output_on_loopback_with_workers(built, s3_bucket):
    root, manifest, _ = built
    bucket, options = s3_bucket
    url = f"{bucket}/datasets/ds"
    build_shards(
        make_items(),
        url,
        splits={"train": 0.75, "val": 0.25},
        shard_max_count=7,
        block_size=16,
        workers=2,
        storage_options=options,
    )
    _assert_same_dataset(url, options, manifest, root)
    with pytest.raises(FileExistsError):
        build_shards(make_items(), url, storage_options=options)
