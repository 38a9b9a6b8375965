"""Golden bytes of a small build: every file of its output, and the ``_build/`` state of a build
that stopped on an I/O error, hashed and compared with digests recorded from the code before the
write side was split into modules (shards, indexes, manifest and resume records must not move by
a byte; a rerun must read the records an earlier version wrote).

Recorded again when blocks began to keep their small last shard of a split as a remainder
(``_build/rest/``) packed with the other blocks' at the end (issue 21 item 6): every full shard
kept its bytes; the remainders moved under ``_build/rest/`` byte for byte, and the packed shards
replaced them in the finished build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from build_shards import build_shards

OPTS = dict(
    splits={"train": 0.6, "val": 0.2, "test": 0.2},
    group_by="group",
    shard_max_count=9,
    shard_max_bytes=30_000,
    block_size=40,
    seed=7,
    allow_nan=True,
)


def samples(n: int, fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise OSError(f"input went away at item {i}")
        vec = np.arange(16, dtype=np.float32) + i
        if i % 50 == 3:
            vec[2] = np.nan
        yield {
            "__key__": f"k{i:05d}",
            "vec": vec,
            "text": "x" * (i % 37),
            "i": i,
            "group": f"g{i // 3}",
        }


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``; the manifest's creation time set to a constant."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if p.name == "manifest.json":
            body = json.loads(data)
            body["build"]["created"] = "CREATED"
            data = json.dumps(body, sort_keys=True).encode()
        out[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()[:16]
    return out


GOLDEN_BUILD: dict[str, str] = {
    "manifest.json": "bf3c2203d7b553d8",
    "test/shard-00000-000.tar": "767ccb2ea5d87b10",
    "test/shard-00000-000.tar.idx": "10996ace3ec45499",
    "test/shard-00000-001.tar": "1c2354fc702a303e",
    "test/shard-00000-001.tar.idx": "10996ace3ec45499",
    "test/shard-00000-002.tar": "ebdfce7591dd5576",
    "test/shard-00000-002.tar.idx": "d3d9f8a2b441464d",
    "test/shard-00001-000.tar": "78d269b750e1ae24",
    "test/shard-00001-000.tar.idx": "eb846ab9a5072bec",
    "test/shard-00002-000.tar": "0fc92d6a78c47d63",
    "test/shard-00002-000.tar.idx": "10996ace3ec45499",
    "test/shard-00002-001.tar": "b7ac0d238dbfab55",
    "test/shard-00002-001.tar.idx": "10996ace3ec45499",
    "test/shard-00002-002.tar": "53ac5c8ee47d6aef",
    "test/shard-00002-002.tar.idx": "d3d9f8a2b441464d",
    "train/shard-00000-000.tar": "fe50036f07f3e6da",
    "train/shard-00000-000.tar.idx": "734097f1c4bee32f",
    "train/shard-00000-001.tar": "97dffa2cdd526fee",
    "train/shard-00000-001.tar.idx": "10996ace3ec45499",
    "train/shard-00000-002.tar": "d32428e3df8bb10c",
    "train/shard-00000-002.tar.idx": "10996ace3ec45499",
    "train/shard-00000-003.tar": "46b2f5fe9999ad53",
    "train/shard-00000-003.tar.idx": "5d37c96118d7fdcc",
    "train/shard-00001-000.tar": "34a81a485cb0c061",
    "train/shard-00001-000.tar.idx": "10996ace3ec45499",
    "train/shard-00001-001.tar": "67caf5b52309c90a",
    "train/shard-00001-001.tar.idx": "10996ace3ec45499",
    "train/shard-00001-002.tar": "b3fa1b39b03e6496",
    "train/shard-00001-002.tar.idx": "10996ace3ec45499",
    "train/shard-00001-003.tar": "3d71af68fd9886a4",
    "train/shard-00001-003.tar.idx": "10996ace3ec45499",
    "train/shard-00001-004.tar": "c9eaf7e901fd08ec",
    "train/shard-00001-004.tar.idx": "7db82adaa2b8af48",
    "train/shard-00002-000.tar": "bb904f79fd5a43ea",
    "train/shard-00002-000.tar.idx": "10996ace3ec45499",
    "train/shard-00002-001.tar": "b846ee6f4551ba78",
    "train/shard-00002-001.tar.idx": "10996ace3ec45499",
    "train/shard-00002-002.tar": "20fcf46993a95fc9",
    "train/shard-00002-002.tar.idx": "dcf88022137efc1d",
    "train/shard-00003-000.tar": "79f17d5526806586",
    "train/shard-00003-000.tar.idx": "10996ace3ec45499",
    "train/shard-00003-001.tar": "ef8f03fd2cec32c9",
    "train/shard-00003-001.tar.idx": "10996ace3ec45499",
    "train/shard-00003-002.tar": "2296e0b8893a647c",
    "train/shard-00003-002.tar.idx": "10996ace3ec45499",
    "val/shard-00001-000.tar": "484ad57fede077ea",
    "val/shard-00001-000.tar.idx": "eb846ab9a5072bec",
}

GOLDEN_STATE: dict[str, str] = {
    "_build/block-00000.json": "4cc46db6fc2afc93",
    "_build/block-00001.json": "4f9b909c1f75af66",
    "_build/block-00002.json": "4c837afed3b767ad",
    "_build/build.json": "55865b44a0d0c1c6",
    "_build/rest/test/shard-00000-002.tar": "3ec6d94ddcd7db5f",
    "_build/rest/test/shard-00000-002.tar.idx": "a0e6a709ec7216fa",
    "_build/rest/train/shard-00001-004.tar": "4a37c213392cbdaf",
    "_build/rest/train/shard-00001-004.tar.idx": "a2e09659f60a857e",
    "_build/rest/train/shard-00002-003.tar": "252af2c42cc6ec0f",
    "_build/rest/train/shard-00002-003.tar.idx": "a0e6a709ec7216fa",
    "_build/rest/val/shard-00001-000.tar": "2b66bc3cc8020018",
    "_build/rest/val/shard-00001-000.tar.idx": "16ac1da15287dad8",
    "test/shard-00000-000.tar": "767ccb2ea5d87b10",
    "test/shard-00000-000.tar.idx": "10996ace3ec45499",
    "test/shard-00000-001.tar": "1c2354fc702a303e",
    "test/shard-00000-001.tar.idx": "10996ace3ec45499",
    "test/shard-00001-000.tar": "78d269b750e1ae24",
    "test/shard-00001-000.tar.idx": "eb846ab9a5072bec",
    "test/shard-00002-000.tar": "0fc92d6a78c47d63",
    "test/shard-00002-000.tar.idx": "10996ace3ec45499",
    "test/shard-00002-001.tar": "b7ac0d238dbfab55",
    "test/shard-00002-001.tar.idx": "10996ace3ec45499",
    "test/shard-00002-002.tar": "53ac5c8ee47d6aef",
    "test/shard-00002-002.tar.idx": "d3d9f8a2b441464d",
    "train/shard-00000-000.tar": "fe50036f07f3e6da",
    "train/shard-00000-000.tar.idx": "734097f1c4bee32f",
    "train/shard-00000-001.tar": "97dffa2cdd526fee",
    "train/shard-00000-001.tar.idx": "10996ace3ec45499",
    "train/shard-00000-002.tar": "d32428e3df8bb10c",
    "train/shard-00000-002.tar.idx": "10996ace3ec45499",
    "train/shard-00000-003.tar": "46b2f5fe9999ad53",
    "train/shard-00000-003.tar.idx": "5d37c96118d7fdcc",
    "train/shard-00001-000.tar": "34a81a485cb0c061",
    "train/shard-00001-000.tar.idx": "10996ace3ec45499",
    "train/shard-00001-001.tar": "67caf5b52309c90a",
    "train/shard-00001-001.tar.idx": "10996ace3ec45499",
    "train/shard-00001-002.tar": "b3fa1b39b03e6496",
    "train/shard-00001-002.tar.idx": "10996ace3ec45499",
    "train/shard-00001-003.tar": "3d71af68fd9886a4",
    "train/shard-00001-003.tar.idx": "10996ace3ec45499",
    "train/shard-00002-000.tar": "bb904f79fd5a43ea",
    "train/shard-00002-000.tar.idx": "10996ace3ec45499",
    "train/shard-00002-001.tar": "b846ee6f4551ba78",
    "train/shard-00002-001.tar.idx": "10996ace3ec45499",
    "train/shard-00002-002.tar": "20fcf46993a95fc9",
    "train/shard-00002-002.tar.idx": "dcf88022137efc1d",
}


def test_a_build_writes_the_same_bytes_as_before(tmp_path):
    build_shards(list(samples(150)), tmp_path / "ds", **OPTS)
    assert digests(tmp_path / "ds") == GOLDEN_BUILD


def test_a_stopped_build_leaves_the_same_records_and_a_rerun_resumes_from_them(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(samples(150, fail_at=130), out, **OPTS)
    assert digests(out) == GOLDEN_STATE
    build_shards(samples(150), out, **OPTS)
    got = digests(out)
    ref = tmp_path / "ref"
    build_shards(samples(150), ref, **OPTS)
    assert got == digests(ref)
