"""Bytes fields declared ``uint8``: fixed-length ones gathered as one ``uint8[B, n]`` array,
variable ones copied once into one buffer per batch; the values are exactly the per-sample
path's, undeclared bytes read the same (``bytes`` when asked), kept batches are never
overwritten, and the errors are the parser's."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from build_shards import build_shards
from wdsloader import DecodeOptions, create_loader
from wdsloader.decode.fastcols import bytes_column
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest, iter_members
from wdsloader.format.ustar import BLOCK

N = 45
BLOB = 20_000  # a long row: copied row by row into a pooled batch array


def _blob(i: int, n: int = BLOB) -> bytes:
    return ((np.arange(n, dtype=np.int64) * 7 + i) % 251).astype(np.uint8).tobytes()


def _rows(var_len=lambda i: i % 7 + 1):
    return [
        {
            "__key__": f"s{i:05d}",
            "blob.bin": _blob(i),
            "var.bin": _blob(i, var_len(i)),
            "label": i,
        }
        for i in range(N)
    ]


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("u8") / "ds")
    schema = {"blob": {"dtype": "uint8"}, "var": {"dtype": "uint8"}}
    build_shards(_rows(), root, schema=schema, shard_max_count=16)
    return root


def _passes(root, **kwargs):
    loader = create_loader(root, "train", batch_size=8, seed=3, drop_last=False, **kwargs)
    return [b for _ in range(2) for b in loader]


def _same(a, b):
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), name
        elif name == "var":
            assert [type(v) for v in x] == [type(v) for v in y], name
            assert all(
                np.array_equal(v, w) and v.dtype == w.dtype for v, w in zip(x, y, strict=True)
            ), name
        else:
            assert x == y, name


def test_declared_fixed_bytes_are_gathered_and_equal_the_parsed_values(declared):
    ds = create_loader(declared, "train", batch_size=8).dataset_obj
    assert ds.columnar is not None and set(ds.columnar.tables) == {"blob"}
    got, want = _passes(declared), _passes(declared, gather=False)
    assert len(got) == len(want) == 2 * 6
    for a, b in zip(got, want, strict=True):
        _same(a, b)
        assert a["blob"].dtype == torch.uint8 and a["blob"].shape == (len(a["__key__"]), BLOB)
        for key, row in zip(a["__key__"], a["blob"], strict=True):
            assert row.numpy().tobytes() == _blob(int(key[1:]))
        for key, v in zip(a["__key__"], a["var"], strict=True):
            assert v.tobytes() == _blob(int(key[1:]), int(key[1:]) % 7 + 1)


def test_undeclared_bytes_read_as_declared_uint8_or_as_bytes_when_asked(tmp_path, declared):
    root = str(tmp_path / "b")
    build_shards(_rows(), root, shard_max_count=16)
    # by default: what the same fields declared uint8 give
    for a, b in zip(_passes(root), _passes(declared), strict=True):
        _same(a, b)
    as_bytes = DecodeOptions(raw_bytes="bytes")
    ds = create_loader(root, "train", batch_size=8, decode=as_bytes).dataset_obj
    # whole batches: the fixed-size blob gathered, the variable one found by the walk
    assert ds.columnar is not None and ds.columnar.tables["blob"].as_bytes
    assert ds.columnar.blobs == ("var",)
    got = _passes(root, decode=as_bytes)
    want = _passes(root, decode=DecodeOptions(raw_bytes="bytes", gather=False))
    for a, b in zip(got, want, strict=True):
        assert a["__key__"] == b["__key__"] and a["blob"] == b["blob"] and a["var"] == b["var"]
        assert torch.equal(a["label"], b["label"])
        assert [type(v) for v in a["blob"]] == [bytes] * len(a["__key__"])
        assert a["blob"] == [_blob(int(k[1:])) for k in a["__key__"]]


def test_variable_bytes_of_one_length_in_a_batch_stack_like_the_parsed_ones(tmp_path):
    """A batch whose variable members share one length: one uint8[B, n] (what the default
    collator stacks the per-sample arrays into); else a list of arrays."""
    root = str(tmp_path / "v")
    build_shards(
        _rows(var_len=lambda i: 3 if i < 16 else i % 5 + 1),
        root,
        schema={"var": {"dtype": "uint8"}},
        shard_max_count=16,
    )
    kw = {"shuffle": False, "fields": ["var", "label"]}
    got, want = _passes(root, **kw), _passes(root, gather=False, **kw)
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    assert isinstance(got[0]["var"], torch.Tensor) and got[0]["var"].shape == (8, 3)
    assert isinstance(got[2]["var"], list)


def test_bytes_column_views_share_one_buffer():
    buf = np.arange(100, dtype=np.uint8)
    cols = bytes_column(buf, np.array([10, 50, 3]), np.array([2, 5, 0]))
    assert [c.tolist() for c in cols] == [[10, 11], [50, 51, 52, 53, 54], []]
    assert cols[0].base is cols[1].base is not None  # one buffer for the batch
    same = bytes_column(buf, np.array([10, 50]), np.array([3, 3]))
    assert same.tolist() == [[10, 11, 12], [50, 51, 52]]
    assert bytes_column(buf, np.array([99]), np.array([2])) is None  # past the buffer


def test_kept_batches_are_never_overwritten_by_later_reads(declared):
    loader = create_loader(declared, "train", batch_size=8, seed=1, drop_last=False)
    kept = [b for _ in range(3) for b in loader]  # every batch of three epochs held at once
    pool = loader.dataset_obj.columnar.out_pool
    for b in kept:
        for key, row in zip(b["__key__"], b["blob"], strict=True):
            assert row.numpy().tobytes() == _blob(int(key[1:]))
    assert pool.reused == 0  # nothing was free while every batch was held
    del kept, b, row
    again = [b["blob"][0, :4].tolist() for b in loader]  # batches dropped as they go
    assert len(again) == 6 and pool.reused > 0


def test_later_passes_read_and_gather_into_the_buffers_of_earlier_ones(declared):
    loader = create_loader(declared, "train", batch_size=8, seed=1, drop_last=False)
    ds = loader.dataset_obj
    first = [b["blob"][:, :2].tolist() for b in loader]
    allocated = (ds.reader.pool.allocated, ds.columnar.out_pool.allocated)
    assert allocated[0] >= 1 and allocated[1] >= 1
    for _ in range(2):
        assert [b["blob"][:, :2].tolist() for b in loader] != first  # a new order each epoch
    # a group's buffer returns once its batches are dropped, which may race the next read by
    # one group: at most one more block over the two passes, each of which reuses blocks
    assert ds.reader.pool.allocated <= allocated[0] + 1 and ds.reader.pool.reused >= 2
    assert ds.columnar.out_pool.allocated == allocated[1]
    copy = pickle.loads(pickle.dumps(ds.reader.pool))  # what a worker process gets: no buffers
    assert copy.free == 0 and copy.keep == ds.reader.pool.keep and ds.reader.pool.free > 0


@pytest.mark.parametrize("gather", [True, False])
def test_a_corrupt_blob_header_is_the_parsers_error_and_skip_drops_only_its_sample(
    tmp_path, gather
):
    root = str(tmp_path / "c")
    build_shards(_rows(), root, schema={"blob": {"dtype": "uint8"}})
    shard = Manifest.load(root).split("train").shards[0]
    path = f"{root}/{shard.path}"
    data = bytearray(open(path, "rb").read())
    idx = np.fromfile(f"{root}/{shard.idx_path}", dtype="<u8").astype(np.int64)
    (m,) = [m for m in iter_members(bytes(data), int(idx[6]), int(idx[7])) if "blob" in m.name]
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
    assert [r.numpy().tobytes() for r in batch["blob"]] == [_blob(i) for i in range(N) if i != 6]
    assert loader.stats["skipped_samples"] == 1


def test_long_npy_rows_are_copied_row_by_row_and_equal_the_parsed_values(tmp_path):
    root = str(tmp_path / "n")
    rows = [
        {"__key__": f"s{i:05d}", "big": np.arange(5000, dtype=np.float32) * i, "label": i}
        for i in range(20)
    ]
    build_shards(rows, root, shard_max_count=8)
    col = create_loader(root, "train", batch_size=8).dataset_obj.columnar
    assert col is not None and "big" in col.tables and col.block_len == 0  # no prefix block
    got, want = _passes(root), _passes(root, gather=False)
    for a, b in zip(got, want, strict=True):
        _same(a, b)
        assert a["big"].shape == (len(a["__key__"]), 5000) and a["big"].dtype == torch.float32
        assert a["big"][:, 1].tolist() == [float(k[1:]) for k in a["__key__"]]
