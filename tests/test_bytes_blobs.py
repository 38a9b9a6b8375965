"""Undeclared bytes fields (no ``dtype``: the value is ``bytes``) take the whole-batch path: a
member of one size in the layout is gathered (a long one read by the batch reader straight into
a ``bytes`` of its own), one of varying size found by the walk; no sample is parsed on its
own, and the values are exactly the per-sample path's."""

from __future__ import annotations

import re

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from wdsloader import create_loader
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest, iter_members
from wdsloader.format.ustar import BLOCK

N = 40
LONG = 20_000  # past LARGE_ROW: read by the batch reader into bytes


def _blob(i: int, n: int) -> bytes:
    return ((np.arange(n, dtype=np.int64) * 5 + i) % 253).astype(np.uint8).tobytes()


def _build(root: str, size=lambda i: LONG, **shards) -> str:
    rows = [{"__key__": f"s{i:05d}", "audio.bin": _blob(i, size(i)), "label": i} for i in range(N)]
    build_shards(rows, root, shards=ShardOptions(**{"max_count": 16, **shards}))
    return root


def _passes(root, **kwargs):
    kw = {"batch_size": 8, "seed": 3, "drop_last": False, **kwargs}
    loader = create_loader(root, "train", **kw)
    return loader, [b for _ in range(2) for b in loader]


def _check(root, size):
    loader, got = _passes(root)
    _, want = _passes(root, gather=False)
    assert len(got) == len(want) == 10
    for a, b in zip(got, want, strict=True):
        assert a["__key__"] == b["__key__"] and a["label"].tolist() == b["label"].tolist()
        assert [type(v) for v in a["audio"]] == [bytes] * len(a["__key__"])
        assert (
            a["audio"] == b["audio"] == [_blob(int(k[1:]), size(int(k[1:]))) for k in a["__key__"]]
        )
    stats = loader.stats
    assert stats["gathered_batches"] == stats["batches"] == 10
    assert stats["parsed_batches"] == stats["parsed_samples"] == 0  # no sample parsed alone
    return loader


@pytest.mark.parametrize("size", [LONG, 700], ids=["long", "short"])
def test_fixed_size_undeclared_blobs_are_gathered_as_bytes(tmp_path, size):
    loader = _check(_build(str(tmp_path / "f"), lambda i: size), lambda i: size)
    ds = loader.dataset_obj
    assert ds.columnar.tables["audio"].as_bytes
    placed = ds.reader.placement is not None and "audio" in ds.reader.placement.targets
    assert placed == (size == LONG)  # long rows: read into their bytes by the read thread


def test_variable_size_undeclared_blobs_are_walked_as_bytes(tmp_path):
    size = lambda i: LONG - 37 * (i % 5)  # noqa: E731
    loader = _check(_build(str(tmp_path / "v"), size), size)
    columnar = loader.dataset_obj.columnar
    assert "audio" not in columnar.tables and columnar.blobs == ("audio",)


def test_batches_kept_while_later_ones_are_read_keep_their_values(tmp_path):
    root = _build(str(tmp_path / "k"))
    loader = create_loader(root, "train", batch_size=8, seed=1, drop_last=False)
    kept = [b for _ in range(3) for b in loader]  # every batch of three epochs held at once
    assert len(kept) == 15
    for b in kept:
        assert b["audio"] == [_blob(int(k[1:]), LONG) for k in b["__key__"]]
    assert loader.stats["parsed_samples"] == 0


@pytest.mark.parametrize("gather", [True, False])
def test_a_corrupt_blob_header_is_the_parsers_error_and_skip_drops_only_its_sample(
    tmp_path, gather
):
    root = _build(str(tmp_path / "c"), max_count=N)
    shard = Manifest.load(root).split("train").shards[0]
    path = f"{root}/{shard.path}"
    data = bytearray(open(path, "rb").read())
    idx = np.fromfile(f"{root}/{shard.idx_path}", dtype="<u8").astype(np.int64)
    (m,) = [m for m in iter_members(bytes(data), int(idx[6]), int(idx[7])) if "audio" in m.name]
    header = m.data_offset - BLOCK
    data[header + 140] ^= 0x01  # the mtime: name, size and data intact, the checksum wrong
    open(path, "wb").write(bytes(data))
    expected = rf"{re.escape(shard.path)} at byte {header}: corrupt tar header"
    kw = {"batch_size": N, "shuffle": False, "drop_last": False, "gather": gather}
    with pytest.raises(ShardFormatError, match=expected):
        list(create_loader(root, "train", **kw))
    loader = create_loader(root, "train", on_error="skip", **kw)
    (batch,) = list(loader)
    assert batch["__key__"] == [f"s{i:05d}" for i in range(N) if i != 6]
    assert batch["audio"] == [_blob(i, LONG) for i in range(N) if i != 6]
    assert loader.stats["skipped_samples"] == 1
