"""The walk over the members whose sizes vary (.cls labels, JSON, text): for a whole batch at
once, step by step or in one pass where an earlier batch of the layout found them, with exactly
the values and errors of parsing every sample."""

from __future__ import annotations

import io
import json
import math
import re
import tarfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from build_shards import build_shards
from tests.shard_edit import header_of, patch_shard
from wdsloader import create_loader
from wdsloader.decode import finder
from wdsloader.decode.walk import KeyNames, walk_members, walk_steps
from wdsloader.errors import DecodeError, ShardFormatError
from wdsloader.format import BLOCK


def _tar(samples, pax: bool = False):
    """Samples (each a list of ``(name, data)``) as one tar in a uint8 buffer; the offset of
    each sample's first header and the end of the last member."""
    out = io.BytesIO()
    starts = []
    fmt = tarfile.PAX_FORMAT if pax else tarfile.USTAR_FORMAT
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for members in samples:
            starts.append(tar.offset)
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 1_700_000_000.5 if pax else 0  # a float mtime: a PAX header
                tar.addfile(info, io.BytesIO(data))
        end = tar.offset
    return np.frombuffer(out.getvalue(), dtype=np.uint8).copy(), np.array(starts), end


def _walk(buf, starts, stops, keys):
    return walk_members(buf, starts, stops, KeyNames(keys, None, None))


def test_walk_members_finds_every_member_of_every_sample():
    buf, starts, end = _tar(
        [[("k1.a", b"x" * 3), ("k1.json", b"{}")], [("k2.a", b"y" * 700), ("k2.json", b"[1]")]]
    )
    stops = np.array([starts[1], end])
    found, steps = _walk(buf, starts, stops, ["k1", "k2"])
    assert list(found) == ["a", "json"]
    pos, sizes = found["json"]
    assert sizes.tolist() == [2, 3]
    assert [buf[p : p + n].tobytes() for p, n in zip(pos, sizes, strict=True)] == [b"{}", b"[1]"]
    assert steps.offsets == ()  # the .json header lies elsewhere in each sample: no steps
    # a member named after another key, or a different member order: the caller must parse
    assert _walk(buf, starts, stops, ["k1", "k3"]) is None
    buf2, starts2, end2 = _tar([[("k1.a", b"x"), ("k1.b", b"y")], [("k2.a", b"z"), ("k2.c", b"w")]])
    assert _walk(buf2, starts2, np.array([starts2[1], end2]), ["k1", "k2"]) is None


def test_the_steps_of_a_walk_find_the_same_members_in_one_pass():
    members = [[("k1.a", b"1"), ("k1.Json", b"{}")], [("k2.a", b"22"), ("k2.Json", b"[1, 2]")]]
    for pax in (False, True):
        buf, starts, end = _tar(members, pax)
        stops = np.array([starts[1], end])
        found, steps = _walk(buf, starts, stops, ["k1", "k2"])
        head = 3 * BLOCK if pax else BLOCK  # a PAX header and its record lead each member
        assert steps.offsets == ((0, 2 * BLOCK, 4 * BLOCK, 6 * BLOCK) if pax else (0, 2 * BLOCK))
        assert steps.names == ((None, b"a", None, b"Json") if pax else (b"a", b"Json"))
        again = walk_steps(buf, starts, stops, KeyNames(["k1", "k2"], None, None), steps)
        assert again is not None and list(again) == ["a", "json"]
        for ext in found:
            assert again[ext][0].tolist() == found[ext][0].tolist()
            assert again[ext][1].tolist() == found[ext][1].tolist()
        assert found["a"][0].tolist() == (starts + head).tolist()


# -- the one-pass check accepts exactly what the walk accepts ---------------------------------

_EXTS = ["a", "cls", "json", "txt"]
_HEADER_FLIPS = st.tuples(st.integers(0, 63), st.integers(0, BLOCK - 1), st.integers(0, 7))


@st.composite
def _batches(draw):
    """Two batches of one member order (a layout learned on the first, checked on the
    second): member sizes around the 512-byte boundary, PAX headers or not, keys of one length
    or not, and in the second batch maybe a flipped bit in a header, a renamed member or
    members in another order."""
    n = draw(st.integers(1, 5))
    pax = draw(st.booleans())
    exts = _EXTS[: draw(st.integers(2, 4))]
    sizes = st.sampled_from([0, 1, 3, 100, 511, 512, 513, 700])
    long_keys = draw(st.booleans())

    def batch(first: int):
        keys = [f"k{first + i}" + ("x" * i if long_keys else "") for i in range(n)]
        order = list(exts)
        if first and draw(st.booleans()):
            order[1:] = draw(st.permutations(order[1:]))
        members = [[(f"{key}.{ext}", b"7" * draw(sizes)) for ext in order] for key in keys]
        if first and draw(st.booleans()):  # one member of another name
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, len(order) - 1))
            name, data = members[i][j]
            members[i][j] = (name.replace(".", ".z", 1), data)
        buf, starts, end = _tar(members, pax)
        return buf, starts, np.append(starts[1:], end), keys

    one = batch(0)
    two = batch(100)
    flip = draw(st.none() | _HEADER_FLIPS)
    if flip is not None:
        buf = two[0]
        headers = [
            p
            for s, e in zip(two[1], two[2], strict=True)
            for p in _header_positions(buf, int(s), int(e))
        ]
        at = headers[flip[0] % len(headers)] + flip[1]
        buf[at] ^= 1 << flip[2]
    return one, two


def _header_positions(buf, start, stop):
    out, pos = [], start
    while pos < stop:
        out.append(pos)
        size = int(buf[pos + 124 : pos + 135].tobytes(), 8)
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return out


@settings(max_examples=300, deadline=None)
@given(_batches())
def test_the_one_pass_check_accepts_exactly_what_the_walk_accepts(batches):
    (buf1, starts1, stops1, keys1), (buf2, starts2, stops2, keys2) = batches
    learned = _walk(buf1, starts1, stops1, keys1)
    if learned is None or not learned[1].offsets:
        return
    steps = learned[1]
    names2 = KeyNames(keys2, None, None)
    fast = walk_steps(buf2, starts2, stops2, names2, steps)
    slow = walk_members(buf2, starts2, stops2, names2)
    if fast is not None:  # anything it accepts, the walk accepts, with the same members
        assert slow is not None and list(fast) == list(slow[0])
        for ext, (pos, sizes) in slow[0].items():
            assert fast[ext][0].tolist() == pos.tolist()
            assert fast[ext][1].tolist() == sizes.tolist()
    if slow is not None and (slow[1].offsets, slow[1].names) == (steps.offsets, steps.names):
        assert fast is not None  # and it accepts every batch laid out like the learned one


# -- through the loader: the same values and errors as parsing every sample -------------------

N = 200
BATCH = 32


def _meta(i: int) -> dict:
    # samples 157 and 187: JSON longer than 512 bytes, the next header lies elsewhere in batch 4
    return {"i": i, "q": f"q{i:08d}", "pad": "p" * (600 if i in (157, 187) else i % 13)}


def _built(tmp_path, meta=_meta, **build) -> str:
    rows = [
        {
            "__key__": f"s{i:05d}",
            "emb": np.full(6, i, np.float32),
            "label": (i * 37) % 1000,
            "meta": meta(i),
            "text": "t" * (i % 4),
        }
        for i in range(N)
    ]
    root = str(tmp_path / "b")
    build_shards(rows, root, shard_max_count=120, **build)
    return root


def _read(root, **kwargs):
    opts = {"batch_size": BATCH, "shuffle": False, "drop_last": False, **kwargs}
    loader = create_loader(root, "train", **opts)
    return loader, list(loader)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for name in x:
            if isinstance(x[name], torch.Tensor):
                assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), name
            else:  # repr: NaN too, and the types of the values
                assert repr(x[name]) == repr(y[name]), name


def test_label_json_and_text_read_the_same_both_ways(tmp_path, monkeypatch):
    root = _built(tmp_path)
    walked = []

    def counted(*args, **kwargs):
        walked.append(1)
        return walk_members(*args, **kwargs)

    monkeypatch.setattr(finder, "walk_members", counted)
    fast, a = _read(root)
    slow, b = _read(root, gather=False)
    _same(a, b)
    assert fast.stats["gathered_batches"] == len(a) == -(-N // BATCH)
    assert [m["i"] for batch in a for m in batch["meta"]] == list(range(N))
    assert a[0]["meta"][3] == _meta(3) and a[0]["label"].tolist()[:3] == [0, 37, 74]
    # walked step by step: batch 0 (learning the layout) and 4 and 5 (the long JSON of 157 and
    # 187 moves the next header); batches 1-3 and 6 checked in one pass against batch 0's
    # sample template (the steps of a walk are forgotten after batch 4, the template is not)
    assert len(walked) == 3


def test_a_json_member_msgspec_refuses_reads_as_json_loads_reads_it(tmp_path):
    def meta(i):
        return {"i": i, "x": float("nan") if i == 40 else i / 7, "big": 10**30 + i}

    root = _built(tmp_path, meta, allow_nan=True)
    _, a = _read(root)
    _, b = _read(root, gather=False)
    _same(a, b)
    value = a[1]["meta"][8]
    assert value["i"] == 40 and math.isnan(value["x"]) and value["big"] == 10**30 + 40


@pytest.mark.parametrize("ext", ["label.cls", "meta.json", "text.txt"])
def test_a_corrupt_header_in_a_later_batch_is_the_row_paths_error(tmp_path, ext):
    """Batch 3's sample 70: a flipped mtime bit in the header of a walked member, after two
    batches taught the walk where those headers lie."""
    root = _built(tmp_path)
    at = {}

    def flip(data, idx):
        at["header"] = header_of(data, idx, 70, ext)
        data[at["header"] + 140] ^= 0x01

    rel = patch_shard(root, flip)
    expected = rf"{re.escape(rel)} at byte {at['header']}: corrupt tar header \(checksum mismatch\)"
    for gather in (True, False):
        with pytest.raises(ShardFormatError, match=expected):
            _read(root, gather=gather)
    fast, a = _read(root, on_error="skip")
    slow, b = _read(root, gather=False, on_error="skip")
    _same(a, b)
    assert fast.stats["skipped_samples"] == slow.stats["skipped_samples"] == 1
    assert 70 not in [m["i"] for batch in a for m in batch["meta"]]


def test_invalid_json_mid_batch_names_the_key_and_field_both_ways(tmp_path):
    def meta(i):
        return {"i": i}

    root = _built(tmp_path, meta)

    def spoil(data, idx):
        data_at = header_of(data, idx, 75, "meta.json") + BLOCK
        assert bytes(data[data_at : data_at + 8]) == b'{"i":75}'
        data[data_at + 7] = ord(",")  # {"i":75, : same size, invalid

    rel = patch_shard(root, spoil)
    expected = rf"{re.escape(rel)}: sample 's00075', field 'meta' \(member s00075\.meta\.json\)"
    for gather in (True, False):
        with pytest.raises(DecodeError, match=expected):
            _read(root, gather=gather)
    _, a = _read(root, on_error="skip")
    _, b = _read(root, gather=False, on_error="skip")
    _same(a, b)
    assert [m["i"] for batch in a for m in batch["meta"]] == [i for i in range(N) if i != 75]
    assert json.dumps(a[0]["meta"][0]) == '{"i": 0}'


# -- names the row parser reads otherwise: never a key or a member of the whole-batch path ----


def _renamed(name: bytes):
    """One sample ``k1.a`` + ``k1.b`` whose first (or, for ``.b``-led names, second) member is
    renamed ``name`` in place, its checksum made sound again."""
    buf, starts, end = _tar([[("k1.a", b"x"), ("k1.b", b"y")]])
    at = 0 if not name.startswith(b"k1.b") else 2 * BLOCK
    field = name + b"\0" * (100 - len(name))
    buf[at : at + 100] = np.frombuffer(field, dtype=np.uint8)
    buf[at + 148 : at + 156] = ord(" ")
    total = int(buf[at : at + BLOCK].astype(np.int64).sum())
    buf[at + 148 : at + 156] = np.frombuffer(b"%06o\0 " % total, dtype=np.uint8)
    return buf, starts, np.array([end])


@pytest.mark.parametrize("name", [b"k\x001.a", b"__k1.a__", b"k1.b/c"])  # __NAME__: metadata
def test_names_the_row_parser_reads_otherwise_leave_the_batch_to_it(name):
    from wdsloader.decode.gather import key_ends
    from wdsloader.decode.parse import parse_sample

    buf, starts, stops = _renamed(name)
    row = parse_sample(buf.tobytes(), 0, int(stops[0]))
    if name.startswith(b"k1."):  # a directory part in the second member: skipped by rows
        assert row[0] == "k1" and list(row[1]) == ["a"]
        assert _walk(buf, starts, stops, ["k1"]) is None
    else:  # the first member: the row parser skips it, its key is the second member's
        assert row[0] == "k1" and list(row[1]) == ["b"]
        assert key_ends(buf[:BLOCK].reshape(1, BLOCK)) is None


def test_keys_led_by_two_underscores_take_the_whole_batch_path():
    """``__k1.a`` is a member of sample ``__k1`` (webdataset's rule; a base64url hash may start
    with ``__``): the batch path reads the keys the row parser reads, and walks the members."""
    from wdsloader.decode.gather import sample_keys
    from wdsloader.decode.parse import parse_sample

    samples = [[(f"{k}.a", b"x"), (f"{k}.b", b"yz")] for k in ("__k1", "k2", "__k3__x")]
    buf, starts, end = _tar(samples)
    stops = np.array([*starts[1:], end])
    keys = sample_keys(buf, np.array(starts))
    rows = [parse_sample(buf.tobytes(), a, b)[0] for a, b in zip(starts, stops, strict=True)]
    assert keys == rows == ["__k1", "k2", "__k3__x"]
    found, _ = _walk(buf, np.array(starts), stops, keys)
    assert list(found) == ["a", "b"] and found["b"][1].tolist() == [2, 2, 2]


def _pax_shard(path, truncate: int | None = None) -> None:
    """A webdataset-style shard (a PAX header before each member) of ``N`` samples: emb.npy
    f32[2, 3], label.cls, meta.json; sample ``truncate``'s emb.npy 8 bytes short (its
    padded size, so every sample's offset, stays the same)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(N):
            arr = io.BytesIO()
            np.save(arr, np.full((2, 3), i, dtype=np.float32))
            emb = arr.getvalue()[:-8] if i == truncate else arr.getvalue()
            members = {"label.cls": b"%d" % (i % 7), "meta.json": b'{"i":%d}' % i, "emb.npy": emb}
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000.5
                tar.addfile(info, io.BytesIO(data))


def test_a_walked_member_of_another_size_than_the_layout_is_an_error_never_values(tmp_path):
    from build_shards.adopt import adopt

    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    _pax_shard(root / "train" / "a.tar")
    adopt(str(root))
    _, good = _read(str(root))
    assert good[1]["emb"][8].tolist() == [[40.0] * 3] * 2
    _pax_shard(root / "train" / "a.tar", truncate=40)  # the same offsets: the idx still holds
    with pytest.raises(DecodeError, match=r"sample '000040', field 'emb'.*truncated"):
        _read(str(root), gather=False)
    with pytest.raises(ShardFormatError, match=r"sample '000040', field 'emb': the manifest's"):
        _read(str(root))
