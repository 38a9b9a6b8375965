"""Whole-batch decoders of small fields (ints, text, JSON) give exactly what the per-sample
decoders give, and step aside for any member they do not read exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.decode.codecs import decode_int
from wdsloader.decode.fastcols import MAX_DIGITS, parse_ints

ALPHABET = "0123456789-+ _\n"


def _members(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The texts laid out 512 bytes apart in one buffer (as members are)."""
    buf = np.full(512 * (len(texts) + 1), ord("9"), dtype=np.uint8)  # junk around members
    positions = np.arange(1, len(texts) + 1, dtype=np.int64) * 512
    for p, t in zip(positions, texts, strict=True):
        buf[p : p + len(t)] = np.frombuffer(t, dtype=np.uint8)
        buf[p + len(t)] = 0
    return buf, positions, np.array([len(t) for t in texts], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(ALPHABET, max_size=21).map(str.encode), min_size=1, max_size=12))
def test_parsed_ints_are_int_of_each_member(texts):
    got = parse_ints(*_members(texts))
    plain = all(
        0 < len(t.removeprefix(b"-")) <= MAX_DIGITS and t.removeprefix(b"-").isdigit()
        for t in texts
    )
    if got is not None:
        assert got.dtype == np.int64 and got.tolist() == [decode_int(t) for t in texts]
    if plain:  # what our builder and webdataset write: always taken
        assert got is not None


@pytest.mark.parametrize(
    "texts",
    [[b"-"], [b""], [b"+5"], [b" 5"], [b"5\n"], [b"1_0"], [b"9" * 19], [b"--1"], [b"1-"]],
)
def test_members_int_reads_differently_are_left_to_the_row_decoder(texts):
    assert parse_ints(*_members(texts)) is None


def test_ints_at_the_limits():
    texts = [b"999999999999999999", b"-999999999999999999", b"0", b"-0", b"007"]
    assert parse_ints(*_members(texts)).tolist() == [int(t) for t in texts]


def _same(a, b):
    assert list(a) == list(b)
    for name in a:
        if isinstance(a[name], torch.Tensor):
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
        else:
            assert a[name] == b[name] and [type(v) for v in a[name]] == [
                type(v) for v in b[name]
            ], name


@pytest.mark.parametrize("fields", [None, ["label", "text"], ["meta", "emb", "small"]])
def test_small_fields_of_built_shards_equal_the_parsed_ones(tmp_path, fields):
    rows = [
        {
            "__key__": f"s{i:05d}",
            "emb": np.full(4, i, dtype=np.float32),
            "label": (i * 7919) % 1000 - 500,  # negative too
            "small": np.int8(i % 100),  # cls with a declared dtype
            "text": "é" * (i % 3) if i >= 40 else "x" * (i % 5),  # ASCII batches, then not
            "meta": {"i": i, "big": 10**20 + i, "f": i / 3, "s": "ü"},
        }
        for i in range(96)
    ]
    build_shards(rows, str(tmp_path / "b"), shard_max_count=40)
    opts = {"batch_size": 16, "drop_last": False, "fields": fields, "shuffle": False}
    fast = create_loader(str(tmp_path / "b"), "train", **opts)
    slow = create_loader(str(tmp_path / "b"), "train", gather=False, **opts)
    a, b = list(fast), list(slow)
    assert len(a) == len(b) == 6
    for x, y in zip(a, b, strict=True):
        _same(x, y)
    # the columnar path runs when a fixed-size field is gathered
    assert fast.stats["gathered_batches"] == (6 if fields is None or "emb" in fields else 0)
    if fields is None:
        assert a[0]["label"].dtype == torch.int64 and a[0]["small"].dtype == torch.int8
        assert a[0]["label"].tolist()[:3] == [-500, 419, 338]
        assert a[5]["text"][1] == "é" * (81 % 3)
