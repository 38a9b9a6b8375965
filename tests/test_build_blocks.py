"""The default block size: from the sample size and the source length, never from ``workers``."""

from __future__ import annotations

import hashlib
import io
import itertools
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest

from build_shards import build_shards
from build_shards.layout.params import (
    BLOCK_SHARDS,
    MIN_BLOCK_BYTES,
    MIN_BLOCKS,
    default_block_size,
    sample_tar_bytes,
)
from wdsloader.format import TarStreamWriter, decode_index, inflate_sample

MiB = 2**20
BLOB = 160 * 1024 + 3 * 512  # a 160 KiB blob sample with a small label and JSON member


def test_a_small_blob_build_is_cut_into_enough_blocks_for_the_workers():
    # 6,000 blobs were one block (4 x shard_max_count): the second worker idled
    block = default_block_size(6_000, BLOB, 10_000, 256 * MiB)
    assert block == math.ceil(6_000 / MIN_BLOCKS) == 375
    assert math.ceil(6_000 / block) == MIN_BLOCKS


def test_big_samples_make_blocks_of_a_few_full_shards_not_of_shard_max_count_items():
    per_shard = (256 * MiB) // BLOB  # shards are bounded by bytes first
    assert default_block_size(10**7, BLOB, 10_000, 256 * MiB) == BLOCK_SHARDS * per_shard
    assert default_block_size(None, BLOB, 10_000, 256 * MiB) == BLOCK_SHARDS * per_shard
    # small samples: bounded by the count
    assert default_block_size(None, 1_000, 10_000, 256 * MiB) == BLOCK_SHARDS * 10_000
    # a sample bigger than a shard: one per shard, four per block
    assert default_block_size(None, 300 * MiB, 10_000, 256 * MiB) == BLOCK_SHARDS


def test_a_tiny_dataset_keeps_blocks_of_at_least_4_mib_or_one_full_shard():
    # 1,000 samples of 13 KB: 16 blocks would be 63 samples (0.8 MB); a block keeps >= 4 MiB
    assert default_block_size(1_000, 13_000, 10_000, 256 * MiB) == MIN_BLOCK_BYTES // 13_000
    # ... unless one full shard is smaller than that
    assert default_block_size(1_000, 13_000, 100, 256 * MiB) == 100
    assert default_block_size(4, 100, 3, MiB) == 3
    assert default_block_size(1, 100, 10_000, MiB) == 1


def test_sample_tar_bytes_counts_a_header_and_padding_per_member():
    assert sample_tar_bytes([("a.npy", b"x" * 513), ("b.cls", b"1")]) == 512 + 1024 + 512 + 512


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"  # it names its build time (build.created)
    }


@pytest.mark.usefixtures("build_workers")
def test_the_default_blocks_give_the_same_bytes_with_1_and_2_workers(tmp_path):
    # 240 samples of ~64 KiB: 4 MiB blocks of 63 samples -> 4 blocks, so both workers build
    items = [
        {"__key__": f"k{i:05d}", "blob.bin": np.full(64 * 1024, i % 251, np.uint8).tobytes()}
        for i in range(240)
    ]
    m1 = build_shards(items, tmp_path / "w1", workers=1)
    m2 = build_shards(items, tmp_path / "w2", workers=2)
    block = m1.build["block_size"]
    assert block == MIN_BLOCK_BYTES // (64 * 1024 + 2 * 512) == 63
    assert m2.build["block_size"] == block
    assert m1.build["num_blocks"] == math.ceil(240 / block) == 4
    # each block's one small shard is a remainder: packed into one shard at the end
    assert [s.num_samples for s in m1.splits["train"].shards] == [240]
    assert _digests(tmp_path / "w1") == _digests(tmp_path / "w2")


def _keys_of(root: Path, manifest, split: str) -> list[str]:
    """The sample keys of a split's shards, read with ``tarfile``, in manifest order."""
    keys = []
    for shard in manifest.splits[split].shards:
        with tarfile.open(root / shard.path) as tar:
            names = [m.name.split(".", 1)[0] for m in tar.getmembers()]
        keys += list(dict.fromkeys(names))
        assert len(dict.fromkeys(names)) == shard.num_samples
    return keys


@pytest.mark.usefixtures("build_workers")
def test_small_splits_are_packed_into_full_shards_the_same_for_any_workers(tmp_path):
    # issue 21: 2,000 rows, shard_max_count=200 gave val and test 10 shards of 13-26 samples
    # each (one per block); each block's small last shard is now packed with the others'
    items = [{"__key__": f"k{i:05d}", "x": i, "text": f"row {i}"} for i in range(2_000)]
    opts = dict(splits={"train": 0.8, "val": 0.1, "test": 0.1}, shard_max_count=200)
    m1 = build_shards(items, tmp_path / "w1", workers=1, **opts)
    m2 = build_shards(items, tmp_path / "w2", workers=2, **opts)
    assert m2.splits == m1.splits
    assert m1.build["num_blocks"] == 10  # the blocks still share the work between the workers
    for name, split in m1.splits.items():
        counts = [s.num_samples for s in split.shards]
        # every shard holds shard_max_count samples, but the split's last
        assert counts[:-1] == [200] * (len(counts) - 1) and 0 < counts[-1] <= 200, (name, counts)
    assert len(m1.splits["val"].shards) <= 2 and len(m1.splits["test"].shards) <= 2
    assert _digests(tmp_path / "w1") == _digests(tmp_path / "w2")
    assert not (tmp_path / "w1" / "_build").exists()  # the remainders went with the state
    # every sample exactly once
    got = {name: _keys_of(tmp_path / "w1", m1, name) for name in m1.splits}
    assert sorted(k for ks in got.values() for k in ks) == [it["__key__"] for it in items]
    # the packed shards are named after the block part their first sample comes from, so
    # the manifest's order is the names' order
    paths = [s.path for s in m1.splits["val"].shards]
    assert paths == sorted(paths) and paths[0] == "val/val-00000-000.tar"


def test_a_split_that_fills_its_block_shards_keeps_them_and_packs_only_the_small_ends(tmp_path):
    # one split, 5 blocks of 50 with shards of 20: each block writes 20 + 20 + a small 10
    items = [{"__key__": f"k{i:05d}", "x": i} for i in range(250)]
    m = build_shards(items, tmp_path / "ds", shard_max_count=20, block_size=50)
    shards = m.splits["train"].shards
    assert [s.num_samples for s in shards] == [20] * 12 + [10]
    names = [Path(s.path).name for s in shards]
    # block 0's two full shards, then the first packed shard (block 0's remainder + block 1's)
    assert names[:4] == [
        "train-00000-000.tar", "train-00000-001.tar", "train-00000-002.tar",
        "train-00001-000.tar",
    ]  # fmt: skip
    keys = _keys_of(tmp_path / "ds", m, "train")
    assert sorted(keys) == [it["__key__"] for it in items]  # each once
    # shards in the order of their first sample: block 0's 0-39, then 40-49 packed with 90-99
    assert keys[40:60] == [f"k{i:05d}" for i in [*range(40, 50), *range(90, 100)]]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_sample_copied_raw_is_the_bytes_write_sample_makes(compression):
    # packing copies the remainders' samples as bytes: the same file, index and layout
    samples = [(f"k{i}", [("x.npy", bytes(200 + i % 2)), ("y.cls", b"%d" % i)]) for i in range(6)]
    direct, copied = io.BytesIO(), io.BytesIO()
    w = TarStreamWriter(direct, compression=compression)
    for key, members in samples:
        w.write_sample(key, members)
    idx, sha = w.close()
    data, offsets = direct.getvalue(), decode_index(idx).tolist()
    c = TarStreamWriter(copied, compression=compression)
    for i, (start, stop) in enumerate(itertools.pairwise(offsets)):
        raw = data[start:stop] if compression is None else inflate_sample(data[start:stop], "s")
        assert c.projected_raw_size(len(raw)) == c.projected_size(samples[i][1])
        c.write_raw(raw, w.layout)
    assert c.close() == (idx, sha) and copied.getvalue() == data
    assert c.layout == w.layout and (compression is not None or w.layout == {"y.cls": [1536, 1]})
