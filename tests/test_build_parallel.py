"""The parallel build path: ``map`` runs in the worker processes (never in the parent, which
only coordinates), worker counts give the same bytes (bytes fields through the spool file and a
``map`` included), and errors raised in a worker name the source item, key and field."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from build_shards import BuildError, build_shards
from build_shards.engines.pool import worker_context
from wdsloader.errors import SchemaError

pytestmark = pytest.mark.usefixtures("build_workers")  # these builds are small: force workers


def record_pid(sample: dict[str, Any]) -> dict[str, Any]:
    """A ``map`` that stores the id of the process it ran in."""
    return {**sample, "pid": os.getpid()}


def double_blob(sample: dict[str, Any]) -> dict[str, Any]:
    """A ``map`` that changes a bytes field and drops every 7th item."""
    if int(sample["__key__"][1:]) % 7 == 3:
        return None  # type: ignore[return-value]
    return {**sample, "blob.bin": sample["blob.bin"] * 2}


def fail_on_s0042(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["__key__"] == "s0042":
        raise RuntimeError("bad row")
    return sample


def _stored(out: Path, ext: str) -> dict[str, bytes]:
    """``{key: data}`` of every ``KEY.ext`` member of the train shards."""
    manifest = json.loads((out / "manifest.json").read_text())
    got: dict[str, bytes] = {}
    for shard in manifest["splits"]["train"]["shards"]:
        with tarfile.open(out / shard["path"]) as tar:
            for member in tar:
                key, _, rest = member.name.partition(".")
                if rest == ext:
                    f = tar.extractfile(member)
                    assert f is not None
                    got[key] = f.read()
    return got


def _digests(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*.tar*"))
    }


def _items(n: int) -> list[dict[str, Any]]:
    return [{"__key__": f"s{i:04d}", "x": np.full(8, i, np.float32)} for i in range(n)]


def test_map_runs_in_the_workers_never_in_the_parent(tmp_path):
    m = build_shards(_items(120), tmp_path / "w2", workers=2, block_size=10, map=record_pid)
    assert m.num_samples == 120
    pids = {int(v) for v in _stored(tmp_path / "w2", "pid.cls").values()}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2

    build_shards(_items(120), tmp_path / "w1", workers=1, block_size=10, map=record_pid)
    assert {int(v) for v in _stored(tmp_path / "w1", "pid.cls").values()} == {os.getpid()}


def test_workers_start_from_a_fork_server_where_the_platform_has_one():
    method = worker_context().get_start_method()
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert method == "forkserver"
    else:
        assert method == "spawn"


@pytest.mark.parametrize("workers", [2, 3])
def test_spooled_bytes_and_a_map_give_the_bytes_of_one_worker(tmp_path, workers):
    # 96 KiB blobs (1.2 MiB a block of 13: spooled through the file) and a map that drops items
    items = [
        {"__key__": f"s{i:04d}", "blob.bin": bytes([i % 251]) * (96 * 1024), "label": i}
        for i in range(130)
    ]
    options = dict(block_size=13, shard_max_count=5, map=double_blob)
    m1 = build_shards(items, tmp_path / "w1", workers=1, **options)
    mw = build_shards(items, tmp_path / "wn", workers=workers, **options)
    assert m1.num_samples == mw.num_samples == 130 - len(range(3, 130, 7))
    assert _digests(tmp_path / "w1") == _digests(tmp_path / "wn")
    blobs = _stored(tmp_path / "wn", "blob.bin")
    assert blobs["s0011"] == bytes([11]) * (192 * 1024)
    assert "s0003" not in blobs and "s0010" not in blobs and "s0128" in blobs


def test_a_map_error_in_a_worker_names_the_source_item_and_key(tmp_path):
    with pytest.raises(BuildError, match=r"map failed on source item 42 \(key 's0042'\): "
                       r"RuntimeError: bad row"):  # fmt: skip
        build_shards(_items(100), tmp_path / "ds", workers=2, block_size=10, map=fail_on_s0042)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_a_bad_value_in_a_worker_names_the_sample_key_and_field(tmp_path):
    items = _items(100)
    items[77]["x"] = np.full(8, np.nan, np.float32)
    with pytest.raises(SchemaError, match=r"s0077.*'x'"):
        build_shards(items, tmp_path / "ds", workers=2, block_size=10)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_npy_fields_are_stored_the_same_through_the_spool(tmp_path):
    items = _items(64)
    build_shards(items, tmp_path / "w2", workers=2, block_size=16)
    stored = _stored(tmp_path / "w2", "x.npy")
    assert len(stored) == 64
    assert np.array_equal(np.load(io.BytesIO(stored["s0033"])), np.full(8, 33, np.float32))
