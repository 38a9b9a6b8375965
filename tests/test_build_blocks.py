"""The default block size: from the sample size and the source length, never from ``workers``."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

from build_shards import build_shards
from build_shards.params import (
    BLOCK_SHARDS,
    MIN_BLOCK_BYTES,
    MIN_BLOCKS,
    default_block_size,
    sample_tar_bytes,
)

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
    assert len(m1.splits["train"].shards) == math.ceil(240 / block) == 4
    assert _digests(tmp_path / "w1") == _digests(tmp_path / "w2")
