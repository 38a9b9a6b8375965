"""Undeclared bytes fields (no ``dtype`` in the schema) read by default as if declared
``uint8`` (one ``uint8[B, n]`` tensor read into pooled batch rows, or a list of uint8 views into
one buffer of the batch), never overwritten while a batch is held; with
``DecodeOptions(raw_bytes="bytes")`` they are ``bytes`` and take the whole-batch path too: a
member of one size in the layout is gathered (a long one read by the batch reader straight into
a ``bytes`` of its own), one of varying size found by the walk; no sample is parsed on its
own, and the values are exactly the per-sample path's."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from wdsloader import DecodeOptions, create_loader
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


AS_BYTES = DecodeOptions(raw_bytes="bytes")


def _passes(root, decode=AS_BYTES, **kwargs):
    kw = {"batch_size": 8, "seed": 3, "drop_last": False, **kwargs}
    loader = create_loader(root, "train", decode=decode, **kw)
    return loader, [b for _ in range(2) for b in loader]


def _check(root, size):
    loader, got = _passes(root)
    _, want = _passes(root, DecodeOptions(raw_bytes="bytes", gather=False))
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
    loader = create_loader(root, "train", batch_size=8, seed=1, drop_last=False, decode=AS_BYTES)
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
    decode = DecodeOptions(raw_bytes="bytes", gather=gather)
    kw = {"batch_size": N, "shuffle": False, "drop_last": False, "decode": decode}
    with pytest.raises(ShardFormatError, match=expected):
        list(create_loader(root, "train", **kw))
    loader = create_loader(root, "train", on_error="skip", **kw)
    (batch,) = list(loader)
    assert batch["__key__"] == [f"s{i:05d}" for i in range(N) if i != 6]
    assert batch["audio"] == [_blob(i, LONG) for i in range(N) if i != 6]
    assert loader.stats["skipped_samples"] == 1


# -- the default: as if declared uint8 ---------------------------------------------------------


def _expected(keys, size=lambda i: LONG):
    return [_blob(int(k[1:]), size(int(k[1:]))) for k in keys]


def test_undeclared_fixed_blobs_default_to_one_uint8_tensor_of_exact_values(tmp_path):
    root = _build(str(tmp_path / "d"))
    loader, got = _passes(root, DecodeOptions())
    _, parsed = _passes(root, DecodeOptions(gather=False))
    _, as_bytes = _passes(root)
    assert len(got) == len(parsed) == len(as_bytes) == 10
    for a, b, c in zip(got, parsed, as_bytes, strict=True):
        assert a["__key__"] == b["__key__"] == c["__key__"]
        blob = a["audio"]
        assert isinstance(blob, torch.Tensor) and blob.dtype == torch.uint8
        assert blob.shape == (len(a["__key__"]), LONG) and torch.equal(blob, b["audio"])
        assert [row.numpy().tobytes() for row in blob] == c["audio"] == _expected(a["__key__"])
    ds = loader.dataset_obj
    assert "audio" in ds.reader.placement.targets and not ds.reader.placement.as_bytes("audio")
    assert loader.stats["gathered_batches"] == 10 and loader.stats["parsed_samples"] == 0


def test_undeclared_variable_blobs_default_to_uint8_views_of_exact_values(tmp_path):
    size = lambda i: LONG - 37 * (i % 5)  # noqa: E731
    root = _build(str(tmp_path / "v"), size)
    loader, got = _passes(root, DecodeOptions())
    _, parsed = _passes(root, DecodeOptions(gather=False))
    for a, b in zip(got, parsed, strict=True):
        assert [(type(v), v.dtype) for v in a["audio"]] == [(np.ndarray, np.uint8)] * len(
            b["audio"]
        )
        assert [v.tobytes() for v in a["audio"]] == [v.tobytes() for v in b["audio"]]
        assert [v.tobytes() for v in a["audio"]] == _expected(a["__key__"], size)
    assert loader.stats["parsed_samples"] == 0


BIG = 140_000  # 8 of them fill more than POOLED_BYTES: a variable column in a pooled block
SIZES = {
    "fixed": lambda i: LONG,
    "var": lambda i: LONG - 37 * (i % 5),
    "var_pooled": lambda i: BIG - 37 * (i % 5),
}


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_a_held_batch_keeps_its_values_while_later_batches_reuse_the_buffers(tmp_path, size):
    """Batch 0 is held while batches 1..n are read and dropped (their buffers recycled)."""
    root = _build(str(tmp_path / "h"), size)
    loader = create_loader(root, "train", batch_size=8, seed=1, drop_last=False)
    ds = loader.dataset_obj
    batches = iter(loader)
    held = next(batches)
    before = [bytes(np.asarray(v)) for v in held["audio"]]
    assert before == _expected(held["__key__"], size)
    later = 0
    for b in batches:  # the rest of the epoch, then 5 more: each batch dropped as it comes
        assert [bytes(np.asarray(v)) for v in b["audio"]] == _expected(b["__key__"], size)
        later += 1
    for _ in range(5):
        for b in loader:
            assert [bytes(np.asarray(v)) for v in b["audio"]] == _expected(b["__key__"], size)
            later += 1
    assert later == 29
    assert ds.reader.pool.reused > 0  # the read buffers were recycled meanwhile
    if size is not SIZES["var"]:  # (a small variable column: a fresh array of its own)
        assert ds.columnar.out_pool.reused > 0  # so were the batch arrays
    assert [bytes(np.asarray(v)) for v in held["audio"]] == before


def test_raw_bytes_takes_uint8_or_bytes_only():
    assert DecodeOptions().raw_bytes == "uint8"
    with pytest.raises(
        ValueError, match=r"^raw_bytes must be one of \('uint8', 'bytes'\), got 'str'$"
    ):
        DecodeOptions(raw_bytes="str")
