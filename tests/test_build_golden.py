"""Golden bytes of a small build: every file of its output, and the ``_build/`` state of a build
that stopped on an I/O error, hashed and compared with digests recorded from the code before the
write side was split into modules (shards, indexes, manifest and resume records must not move by
a byte; a rerun must read the records an earlier version wrote). The digests were recorded again
when shards were named after their split and indexes hidden (``train/train-00000-000.tar`` and
``train/.train-00000-000.tar.wdsidx``): every shard and index kept its bytes (the key indexes ``.X.tar.wdskeys`` joined them later), the manifest and
records changed only in those paths; :data:`LEGACY_STATE` is the earlier version's state..

Recorded again when blocks began to keep their small last shard of a split as a remainder
(``_build/rest/``) packed with the other blocks' at the end: every full shard kept its bytes;
the remainders moved under ``_build/rest/`` byte for byte, and the packed shards replaced them
in the finished build. The card (``README.md``) was recorded again when it began to list the side
files the manifest declares."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from build_shards import build_shards

# builds stop at item 130: the schema comes from the first sample, as when the digests were taken
pytestmark = pytest.mark.usefixtures("infer_first_sample_only")
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
    "README.md": "20afd9d152364d94",
    "manifest.json": "a4b1510b7077e98a",
    "test/.test-00000-000.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00000-000.tar.wdskeys": "45b6e7e021422b9e",
    "test/.test-00000-001.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00000-001.tar.wdskeys": "b3886c4db32f8265",
    "test/.test-00000-002.tar.wdsidx": "d3d9f8a2b441464d",
    "test/.test-00000-002.tar.wdskeys": "512cf2b735ecd34d",
    "test/.test-00001-000.tar.wdsidx": "eb846ab9a5072bec",
    "test/.test-00001-000.tar.wdskeys": "cf1029fc94f154e7",
    "test/.test-00002-000.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00002-000.tar.wdskeys": "20354e846f9f37f5",
    "test/.test-00002-001.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00002-001.tar.wdskeys": "bf9b8430238d8dd6",
    "test/.test-00002-002.tar.wdsidx": "d3d9f8a2b441464d",
    "test/.test-00002-002.tar.wdskeys": "683f0c5eadbb97a3",
    "test/test-00000-000.tar": "767ccb2ea5d87b10",
    "test/test-00000-001.tar": "1c2354fc702a303e",
    "test/test-00000-002.tar": "ebdfce7591dd5576",
    "test/test-00001-000.tar": "78d269b750e1ae24",
    "test/test-00002-000.tar": "0fc92d6a78c47d63",
    "test/test-00002-001.tar": "b7ac0d238dbfab55",
    "test/test-00002-002.tar": "53ac5c8ee47d6aef",
    "train/.train-00000-000.tar.wdsidx": "734097f1c4bee32f",
    "train/.train-00000-000.tar.wdskeys": "d01313b7dac9c4e1",
    "train/.train-00000-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00000-001.tar.wdskeys": "c7212b31419d3e38",
    "train/.train-00000-002.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00000-002.tar.wdskeys": "9ac6149107f19a4e",
    "train/.train-00000-003.tar.wdsidx": "5d37c96118d7fdcc",
    "train/.train-00000-003.tar.wdskeys": "726480af83b8abcd",
    "train/.train-00001-000.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-000.tar.wdskeys": "84a5b14513e3df71",
    "train/.train-00001-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-001.tar.wdskeys": "2bb6b95c17418521",
    "train/.train-00001-002.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-002.tar.wdskeys": "091bb8f75a188ced",
    "train/.train-00001-003.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-003.tar.wdskeys": "22809d8a42526801",
    "train/.train-00001-004.tar.wdsidx": "7db82adaa2b8af48",
    "train/.train-00001-004.tar.wdskeys": "f66f048f11e5776b",
    "train/.train-00002-000.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00002-000.tar.wdskeys": "8449206a3c2eb8f7",
    "train/.train-00002-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00002-001.tar.wdskeys": "a22d32f0543d0c5c",
    "train/.train-00002-002.tar.wdsidx": "dcf88022137efc1d",
    "train/.train-00002-002.tar.wdskeys": "368c29cc9d112ad9",
    "train/.train-00003-000.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00003-000.tar.wdskeys": "2c1496cc0b6182db",
    "train/.train-00003-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00003-001.tar.wdskeys": "cef630f674fc39bc",
    "train/.train-00003-002.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00003-002.tar.wdskeys": "ad5ee9eb7374e13b",
    "train/train-00000-000.tar": "fe50036f07f3e6da",
    "train/train-00000-001.tar": "97dffa2cdd526fee",
    "train/train-00000-002.tar": "d32428e3df8bb10c",
    "train/train-00000-003.tar": "46b2f5fe9999ad53",
    "train/train-00001-000.tar": "34a81a485cb0c061",
    "train/train-00001-001.tar": "67caf5b52309c90a",
    "train/train-00001-002.tar": "b3fa1b39b03e6496",
    "train/train-00001-003.tar": "3d71af68fd9886a4",
    "train/train-00001-004.tar": "c9eaf7e901fd08ec",
    "train/train-00002-000.tar": "bb904f79fd5a43ea",
    "train/train-00002-001.tar": "b846ee6f4551ba78",
    "train/train-00002-002.tar": "20fcf46993a95fc9",
    "train/train-00003-000.tar": "79f17d5526806586",
    "train/train-00003-001.tar": "ef8f03fd2cec32c9",
    "train/train-00003-002.tar": "2296e0b8893a647c",
    "val/.val-00001-000.tar.wdsidx": "eb846ab9a5072bec",
    "val/.val-00001-000.tar.wdskeys": "b6075acc7ea5af37",
    "val/val-00001-000.tar": "484ad57fede077ea",
}

GOLDEN_STATE: dict[str, str] = {
    "_build/block-00000.json": "a9130a070181dba6",
    "_build/block-00001.json": "97355034ab81d2b1",
    "_build/block-00002.json": "fdc80f41faaed165",
    "_build/build.json": "4c6631a2edc352aa",
    "_build/rest/test/.test-00000-002.tar.wdsidx": "a0e6a709ec7216fa",
    "_build/rest/test/.test-00000-002.tar.wdskeys": "800c298437d95f72",
    "_build/rest/test/test-00000-002.tar": "3ec6d94ddcd7db5f",
    "_build/rest/train/.train-00001-004.tar.wdsidx": "a2e09659f60a857e",
    "_build/rest/train/.train-00001-004.tar.wdskeys": "d35b9ad17ed181a3",
    "_build/rest/train/.train-00002-003.tar.wdsidx": "a0e6a709ec7216fa",
    "_build/rest/train/.train-00002-003.tar.wdskeys": "56cd125c17cd16a3",
    "_build/rest/train/train-00001-004.tar": "4a37c213392cbdaf",
    "_build/rest/train/train-00002-003.tar": "252af2c42cc6ec0f",
    "_build/rest/val/.val-00001-000.tar.wdsidx": "16ac1da15287dad8",
    "_build/rest/val/.val-00001-000.tar.wdskeys": "945ea47fa06116e4",
    "_build/rest/val/val-00001-000.tar": "2b66bc3cc8020018",
    "test/.test-00000-000.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00000-000.tar.wdskeys": "45b6e7e021422b9e",
    "test/.test-00000-001.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00000-001.tar.wdskeys": "b3886c4db32f8265",
    "test/.test-00001-000.tar.wdsidx": "eb846ab9a5072bec",
    "test/.test-00001-000.tar.wdskeys": "cf1029fc94f154e7",
    "test/.test-00002-000.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00002-000.tar.wdskeys": "20354e846f9f37f5",
    "test/.test-00002-001.tar.wdsidx": "10996ace3ec45499",
    "test/.test-00002-001.tar.wdskeys": "bf9b8430238d8dd6",
    "test/.test-00002-002.tar.wdsidx": "d3d9f8a2b441464d",
    "test/.test-00002-002.tar.wdskeys": "683f0c5eadbb97a3",
    "test/test-00000-000.tar": "767ccb2ea5d87b10",
    "test/test-00000-001.tar": "1c2354fc702a303e",
    "test/test-00001-000.tar": "78d269b750e1ae24",
    "test/test-00002-000.tar": "0fc92d6a78c47d63",
    "test/test-00002-001.tar": "b7ac0d238dbfab55",
    "test/test-00002-002.tar": "53ac5c8ee47d6aef",
    "train/.train-00000-000.tar.wdsidx": "734097f1c4bee32f",
    "train/.train-00000-000.tar.wdskeys": "d01313b7dac9c4e1",
    "train/.train-00000-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00000-001.tar.wdskeys": "c7212b31419d3e38",
    "train/.train-00000-002.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00000-002.tar.wdskeys": "9ac6149107f19a4e",
    "train/.train-00000-003.tar.wdsidx": "5d37c96118d7fdcc",
    "train/.train-00000-003.tar.wdskeys": "726480af83b8abcd",
    "train/.train-00001-000.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-000.tar.wdskeys": "84a5b14513e3df71",
    "train/.train-00001-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-001.tar.wdskeys": "2bb6b95c17418521",
    "train/.train-00001-002.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-002.tar.wdskeys": "091bb8f75a188ced",
    "train/.train-00001-003.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00001-003.tar.wdskeys": "22809d8a42526801",
    "train/.train-00002-000.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00002-000.tar.wdskeys": "8449206a3c2eb8f7",
    "train/.train-00002-001.tar.wdsidx": "10996ace3ec45499",
    "train/.train-00002-001.tar.wdskeys": "a22d32f0543d0c5c",
    "train/.train-00002-002.tar.wdsidx": "dcf88022137efc1d",
    "train/.train-00002-002.tar.wdskeys": "368c29cc9d112ad9",
    "train/train-00000-000.tar": "fe50036f07f3e6da",
    "train/train-00000-001.tar": "97dffa2cdd526fee",
    "train/train-00000-002.tar": "d32428e3df8bb10c",
    "train/train-00000-003.tar": "46b2f5fe9999ad53",
    "train/train-00001-000.tar": "34a81a485cb0c061",
    "train/train-00001-001.tar": "67caf5b52309c90a",
    "train/train-00001-002.tar": "b3fa1b39b03e6496",
    "train/train-00001-003.tar": "3d71af68fd9886a4",
    "train/train-00002-000.tar": "bb904f79fd5a43ea",
    "train/train-00002-001.tar": "b846ee6f4551ba78",
    "train/train-00002-002.tar": "20fcf46993a95fc9",
}

# the state the same stopped build left before shards were named after their split and indexes
# hidden (``train/shard-00000-000.tar`` + ``.tar.idx``, prefix ``shard``): a rerun resumes it
LEGACY_STATE: dict[str, str] = {
    "_build/block-00000.json": "07d02e4600276363",
    "_build/block-00001.json": "a41412865463ce48",
    "_build/block-00002.json": "445754174012c758",
    "_build/build.json": "55865b44a0d0c1c6",
    "test/shard-00000-000.tar": "767ccb2ea5d87b10",
    "test/shard-00000-000.tar.idx": "10996ace3ec45499",
    "test/shard-00000-001.tar": "1c2354fc702a303e",
    "test/shard-00000-001.tar.idx": "10996ace3ec45499",
    "test/shard-00000-002.tar": "3ec6d94ddcd7db5f",
    "test/shard-00000-002.tar.idx": "a0e6a709ec7216fa",
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
    "train/shard-00001-004.tar": "4a37c213392cbdaf",
    "train/shard-00001-004.tar.idx": "a2e09659f60a857e",
    "train/shard-00002-000.tar": "bb904f79fd5a43ea",
    "train/shard-00002-000.tar.idx": "10996ace3ec45499",
    "train/shard-00002-001.tar": "b846ee6f4551ba78",
    "train/shard-00002-001.tar.idx": "10996ace3ec45499",
    "train/shard-00002-002.tar": "20fcf46993a95fc9",
    "train/shard-00002-002.tar.idx": "dcf88022137efc1d",
    "train/shard-00002-003.tar": "252af2c42cc6ec0f",
    "train/shard-00002-003.tar.idx": "a0e6a709ec7216fa",
    "val/shard-00001-000.tar": "2b66bc3cc8020018",
    "val/shard-00001-000.tar.idx": "16ac1da15287dad8",
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


def to_legacy_state(root: Path) -> None:
    """Turn a stopped build's files into those the earlier version left: shards named
    ``shard-BBBBB-PPP.tar`` with a visible ``.tar.idx``, and each block's small last shard of a
    split among its shards in the split's folder (that version kept no remainders apart)."""
    shard = re.compile(r"(?:_build/rest/)?(\w+)/(?:\.)?\1-(\d{5}-\d{3})\.tar(\.wdsidx)?")

    def legacy(m: re.Match[str]) -> str:
        return f"{m[1]}/shard-{m[2]}.tar" + (".idx" if m[3] else "")

    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and shard.fullmatch(rel):
            p.rename(root / shard.sub(legacy, rel))
    shutil.rmtree(root / "_build" / "rest", ignore_errors=True)
    for p in root.rglob(".*.wdskeys"):  # that version wrote no key index
        p.unlink()
    for p in (root / "_build").glob("block-*.json"):
        record = json.loads(p.read_text())
        for split, info in record.pop("rests", {}).items():
            record["splits"].setdefault(split, []).append(info)
        for shards in record["splits"].values():
            for info in shards:
                info.pop("keys_path", None)
        p.write_text(shard.sub(legacy, json.dumps(record)))
    build = root / "_build" / "build.json"
    build.write_text(build.read_text().replace('"prefix": "{split}"', '"prefix": "shard"'))


LEGACY_RECORDS = [f"_build/block-0000{b}.json" for b in range(3)]


def _keys(root: Path) -> list[str]:
    """The sample keys of every split, each split's sorted (a multiset: a repeat would show)."""
    from wdsloader import create_loader

    keys = []
    for split in ("train", "val", "test"):
        loader = create_loader(root, split, batch_size=1, shuffle=False, drop_last=False)
        keys += sorted(k for batch in loader for k in batch["__key__"])
    return keys


def test_a_build_stopped_by_the_earlier_version_resumes_with_its_names(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(samples(150, fail_at=130), out, **OPTS)
    to_legacy_state(out)
    assert digests(out) == LEGACY_STATE  # exactly what the earlier version left
    for p in LEGACY_RECORDS:
        (tmp_path / p).parent.mkdir(exist_ok=True)
        (tmp_path / p).write_bytes((out / p).read_bytes())
    manifest = build_shards(samples(150), out, **OPTS)
    paths = [s.path for split in manifest.splits.values() for s in split.shards]
    assert all(re.fullmatch(r"(train|val|test)/shard-\d{5}-\d{3}\.tar", p) for p in paths)
    kept = {
        info["sha256"]
        for p in LEGACY_RECORDS
        for shards in json.loads((tmp_path / p).read_text())["splits"].values()
        for info in shards
    }
    # the kept blocks' shards (their small last ones included: that version packed none) stay
    # as they were; the blocks after them are written and packed as this version does
    assert kept <= {s.sha256 for split in manifest.splits.values() for s in split.shards}
    ref = build_shards(samples(150), tmp_path / "ref", **OPTS)
    for name, split in manifest.splits.items():
        assert split.num_samples == ref.splits[name].num_samples
    assert _keys(out) == _keys(tmp_path / "ref")  # every sample exactly once
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "manifest.json",
        "test",
        "train",
        "val",
    ]
