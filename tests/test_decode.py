"""Sample splitting (parse_sample), the decoder registry and SampleDecoder."""

from __future__ import annotations

import io
import json
import pickle
import sys
import tarfile

import numpy as np
import pytest
import torch

from tests.dataset_factory import SCHEMA, npy_bytes, sample_members, write_dataset
from wdsloader.decode import (
    SampleDecoder,
    decode_image,
    decode_npy,
    get_decoder,
    parse_sample,
    register_decoder,
)
from wdsloader.decode import codecs as dec
from wdsloader.errors import DecodeError, PickleNotAllowedError, ShardFormatError
from wdsloader.format import (
    FieldSpec,
    TarStreamWriter,
    decode_index,
    encode_member,
    iter_samples,
)


@pytest.fixture(autouse=True)
def _restore_registry():
    saved = dict(dec._REGISTRY)
    yield
    dec._REGISTRY.clear()
    dec._REGISTRY.update(saved)


def _shard(n: int, start: int = 0) -> tuple[bytes, list[int]]:
    buf = io.BytesIO()
    w = TarStreamWriter(buf)
    for i in range(start, start + n):
        w.write_sample(f"s{i:07d}", sample_members(i, 0))
    idx, _ = w.close()
    return buf.getvalue(), decode_index(idx).tolist()


def _tar(members: list[tuple[str, bytes]], fmt: int) -> tuple[bytes, dict[str, int]]:
    """A tar written by Python's tarfile; returns its bytes and each member's first offset."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            info.uname = "someone"
            tf.addfile(info, io.BytesIO(data))
    raw = out.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        offsets = {m.name: m.offset for m in tf.getmembers()}  # first header, PAX/GNU included
    return raw, offsets


# ------------------------------------------------------------------------------------------------
# parse_sample
# ------------------------------------------------------------------------------------------------


def test_parse_sample_on_a_factory_shard(tmp_path):
    write_dataset(str(tmp_path), {"train": [4, 3]})
    data = (tmp_path / "train/shard-000001.tar").read_bytes()
    offsets = decode_index((tmp_path / "train/.shard-000001.tar.wdsidx").read_bytes()).tolist()
    assert len(offsets) == 4
    for j in range(3):
        i = 4 + j
        key, raw = parse_sample(data, offsets[j], offsets[j + 1], source="train/shard-000001.tar")
        assert key == f"train{i:07d}"
        assert list(raw) == ["vec.npy", "idx.cls", "meta.json"]
        assert all(isinstance(v, memoryview) for v in raw.values())
        assert {k: bytes(v) for k, v in raw.items()} == dict(sample_members(i, 1))
        # The same sample read as a byte range of the shard, offsets relative to the range.
        part = data[offsets[j] : offsets[j + 1]]
        key2, raw2 = parse_sample(memoryview(part), base_offset=offsets[j])
        assert key2 == key and {k: bytes(v) for k, v in raw2.items()} == dict(sample_members(i, 1))


def test_parse_sample_agrees_with_iter_samples():
    data, offsets = _shard(50)
    expected = list(iter_samples(data))
    for j, (key, start, fields) in enumerate(expected):
        assert start == offsets[j]
        got_key, raw = parse_sample(data, offsets[j], offsets[j + 1])
        assert got_key == key
        assert {e: bytes(v) for e, v in raw.items()} == {
            e: data[off : off + size] for e, (off, size) in fields.items()
        }


def test_parse_sample_last_range_may_include_the_end_of_archive():
    data, offsets = _shard(2)
    key, raw = parse_sample(data, offsets[1], len(data))
    assert key == "s0000001" and len(raw) == 3


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_parse_sample_on_tarfile_archives(fmt):
    long_key = "k" * 120
    members = [
        ("plain.TXT", b"one"),  # extension lower-cased
        ("plain.Seg.PNG", b"two"),
        ("dir/sub/prefixed.json", b'{"a": 1}'),  # key keeps its directory
        ("dir/sub/prefixed.cls", b"3"),
        ("caf\u00e9.txt", "n\u00e9e".encode()),  # non-ASCII name: a PAX header in PAX_FORMAT
        ("caf\u00e9.__skip", b"x"),
        (f"{long_key}.npy", npy_bytes(np.arange(3, dtype=np.int16))),  # long name: PAX / GNU L
        (f"{long_key}.txt", b"long"),
    ]
    raw_tar, first = _tar(members, fmt)
    starts = [
        first["plain.TXT"],
        first["dir/sub/prefixed.json"],
        first["caf\u00e9.txt"],
        first[f"{long_key}.npy"],
    ]
    end = len(raw_tar.rstrip(b"\0")) + 511 & ~511  # after the last member's padded data
    bounds = list(zip(starts, [*starts[1:], end], strict=True))
    got = [parse_sample(raw_tar, a, b, source="x.tar") for a, b in bounds]
    as_bytes = [(k, {e: bytes(v) for e, v in r.items()}) for k, r in got]
    assert as_bytes == [
        ("plain", {"txt": b"one", "seg.png": b"two"}),
        ("dir/sub/prefixed", {"json": b'{"a": 1}', "cls": b"3"}),
        ("caf\u00e9", {"txt": "n\u00e9e".encode(), "__skip": b"x"}),
        (long_key, {"npy": npy_bytes(np.arange(3, dtype=np.int16)), "txt": b"long"}),
    ]


def test_parse_sample_rejects_two_keys_in_one_range():
    data, offsets = _shard(3)
    with pytest.raises(ShardFormatError) as err:
        parse_sample(data, offsets[0], offsets[2], base_offset=10_000, source="a/shard.tar")
    msg = str(err.value)
    # The first member of the second sample sits at offsets[1].
    assert f"a/shard.tar at byte {10_000 + offsets[1]}" in msg
    assert "'s0000001.vec.npy'" in msg and "'s0000000'" in msg


def test_parse_sample_rejects_an_empty_range_and_zeros():
    data, offsets = _shard(1)
    with pytest.raises(ShardFormatError, match=r"s\.tar at byte 7: no sample member"):
        parse_sample(data, 0, 0, base_offset=7, source="s.tar")
    eoa = offsets[1]
    with pytest.raises(ShardFormatError, match=rf"s\.tar at byte {eoa}: no sample member"):
        parse_sample(data, eoa, len(data), source="s.tar")


def test_parse_sample_rejects_a_repeated_extension():
    data = encode_member("k.txt", b"a") + encode_member("k.TXT", b"b")
    with pytest.raises(ShardFormatError, match="at byte 1024: sample 'k' has the extension 'txt'"):
        parse_sample(data, source="s.tar")


@pytest.mark.parametrize("where", [5, 124, 150, 300])
def test_parse_sample_detects_a_corrupt_header(where):
    data, offsets = _shard(2)
    bad = bytearray(data)
    second = offsets[1] + 512 + 512  # the second member's header (vec.npy data is < 512 bytes)
    bad[second + where] ^= 0x01
    with pytest.raises(ShardFormatError, match=rf"s\.tar at byte {second}: corrupt tar header"):
        parse_sample(bytes(bad), offsets[1], offsets[2], source="s.tar")


def test_parse_sample_detects_truncation():
    data, offsets = _shard(2)
    cut = data[: offsets[1] + 600]  # inside the first member's data of sample 1 (144 bytes)
    with pytest.raises(ShardFormatError, match=rf"s\.tar at byte {offsets[1]}: sample range ends"):
        parse_sample(cut, offsets[1], offsets[2], source="s.tar")
    with pytest.raises(
        ShardFormatError, match=rf"at byte {offsets[1]}: member data .*truncated shard"
    ):
        parse_sample(cut, offsets[1], source="s.tar")
    # A range shorter than its sample's data: the index disagrees with the tar.
    with pytest.raises(ShardFormatError, match="runs past the end of the sample range"):
        parse_sample(data, offsets[1], offsets[1] + 600, source="s.tar")


# ------------------------------------------------------------------------------------------------
# the default decoders
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(7, dtype=np.int64),
        np.array([True, False, True]),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.zeros((0, 3), dtype=np.uint8),
        np.arange(4, dtype=">i4"),
        np.array([(1, 2.5)], dtype=[("a", "<i2"), ("b", "<f8")]),
        np.array(["ab", "c"]),
    ],
    ids=["f32", "scalar", "bool", "fortran", "empty", "bigendian", "record", "unicode"],
)
def test_npy_round_trip(arr):
    data = npy_bytes(arr)
    for buf in (data, memoryview(data), bytearray(data)):
        out = decode_npy(buf)
        assert out.dtype == arr.dtype and out.shape == arr.shape
        np.testing.assert_array_equal(out, arr)
        assert out.flags.writeable and out.flags.owndata  # a copy: does not pin the shard
    assert decode_npy(data).flags.f_contiguous == arr.flags.f_contiguous


def test_npy_version_2_header_and_bad_input():
    arr = np.arange(5, dtype=np.int32)
    out = io.BytesIO()
    np.lib.format.write_array(out, arr, version=(2, 0))
    np.testing.assert_array_equal(decode_npy(out.getvalue()), arr)
    with pytest.raises(ValueError, match="bad magic"):
        decode_npy(b"not numpy at all")
    with pytest.raises(ValueError, match=r"truncated: 12 bytes for shape \(5,\) of int32 \(20"):
        decode_npy(npy_bytes(arr)[:-8])


def test_npy_object_dtype_is_refused_without_pickle():
    data = io.BytesIO()
    np.save(data, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(PickleNotAllowedError, match="allow_pickle=True"):
        decode_npy(data.getvalue())
    raw = {"obj.npy": memoryview(data.getvalue())}
    with pytest.raises(PickleNotAllowedError, match=r"s\.tar: sample 'k', field 'obj'"):
        SampleDecoder()(raw, "k", "s.tar")
    got = SampleDecoder(allow_pickle=True)(raw, "k", "s.tar")["obj"]
    assert got.dtype == object and got.tolist() == [{"a": 1}, None]


def test_npz():
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3), b=np.ones((2, 2), dtype=np.float32))
    out = get_decoder("npz")(memoryview(buf.getvalue()))
    assert sorted(out) == ["a", "b"]
    np.testing.assert_array_equal(out["a"], np.arange(3))
    assert out["b"].dtype == np.float32
    bad = io.BytesIO()
    np.savez(bad, o=np.array([None, 1], dtype=object))
    with pytest.raises(PickleNotAllowedError, match="allow_pickle=True"):
        get_decoder("npz")(bad.getvalue())


@pytest.mark.parametrize(
    ("encoding", "data", "expected"),
    [
        ("json", b'{"a": [1, 2.5, null], "b": "\xc3\xa9"}', {"a": [1, 2.5, None], "b": "\u00e9"}),
        ("jsn", b"[1, 2]", [1, 2]),
        ("txt", "caf\u00e9\n".encode(), "caf\u00e9\n"),
        ("text", b"x", "x"),
        ("cls", b" 42\n", 42),
        ("cls2", b"-3", -3),
        ("index", b"7", 7),
        ("id", b"123456789012", 123456789012),
        ("bin", b"\x00\x01raw", b"\x00\x01raw"),
        ("weird", b"abc", b"abc"),
    ],
)
def test_simple_decoders(encoding, data, expected):
    out = get_decoder(encoding)(memoryview(data))
    assert out == expected and type(out) is type(expected)


def test_decoders_are_case_insensitive_and_unknown_means_bytes():
    assert get_decoder("NPY") is decode_npy
    assert get_decoder("nope") is dec.decode_bytes


class _Custom:
    def __init__(self, v: int) -> None:
        self.v = v


def test_pt_uses_weights_only():
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3), "n": 2}, buf)
    out = get_decoder("pt")(memoryview(buf.getvalue()))
    assert torch.equal(out["w"], torch.arange(3)) and out["n"] == 2
    assert get_decoder("pth") is get_decoder("pt")
    evil = io.BytesIO()
    torch.save(_Custom(5), evil)
    raw = {"obj.pt": memoryview(evil.getvalue())}
    with pytest.raises(DecodeError, match=r"s\.tar: sample 'k', field 'obj'.*UnpicklingError"):
        SampleDecoder()(raw, "k", "s.tar")
    assert SampleDecoder(allow_pickle=True)(raw, "k", "s.tar")["obj"].v == 5


def _image_bytes(arr: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize(("encoding", "fmt"), [("png", "PNG"), ("bmp", "BMP"), ("tif", "TIFF")])
def test_lossless_images_round_trip(encoding, fmt):
    pytest.importorskip("PIL")
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    out = get_decoder(encoding)(memoryview(_image_bytes(rgb, fmt)))
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3)
    np.testing.assert_array_equal(out, rgb)
    grey = rng.integers(0, 256, size=(4, 6), dtype=np.uint8)
    np.testing.assert_array_equal(decode_image(_image_bytes(grey, fmt)), grey[:, :, None])


def test_png_alpha_and_lossy_formats():
    pytest.importorskip("PIL")
    rgba = np.zeros((3, 4, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.arange(4) * 60
    np.testing.assert_array_equal(decode_image(_image_bytes(rgba, "PNG")), rgba)
    flat = np.full((8, 8, 3), 120, dtype=np.uint8)
    for enc, fmt in [("jpg", "JPEG"), ("jpeg", "JPEG"), ("webp", "WEBP"), ("gif", "GIF")]:
        out = get_decoder(enc)(_image_bytes(flat, fmt))
        assert out.dtype == np.uint8 and out.shape == (8, 8, 3), enc
        assert np.abs(out.astype(int) - 120).max() <= 3, enc


def test_missing_pillow_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="decoding images needs Pillow"):
        decode_image(b"\x89PNG")
    with pytest.raises(DecodeError, match="field 'jpg'.*needs Pillow"):
        SampleDecoder()({"jpg": memoryview(b"x")}, "k", "s.tar")


def test_pickle_is_refused_unless_opted_in():
    payload = pickle.dumps({"x": [1, 2]})
    for enc in ("pkl", "pickle", "pyd"):
        with pytest.raises(PickleNotAllowedError, match="allow_pickle=True"):
            get_decoder(enc)(payload)
    raw = {"meta.pkl": memoryview(payload), "txt": memoryview(b"hi")}
    with pytest.raises(PickleNotAllowedError) as err:
        SampleDecoder()(raw, "k1", "data/shard-000003.tar")
    msg = str(err.value)
    assert "data/shard-000003.tar: sample 'k1', field 'meta' (member k1.meta.pkl)" in msg
    assert "pass allow_pickle=True if you trust the data" in msg
    # Not requested: never decoded, so no error.
    assert SampleDecoder(fields=["txt"])(raw, "k1", "s") == {"__key__": "k1", "txt": "hi"}
    assert SampleDecoder(allow_pickle=True)(raw, "k1", "s")["meta"] == {"x": [1, 2]}


# ------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------


def test_register_decoder():
    def upper(buf):
        return bytes(buf).upper()

    register_decoder("Shout", upper)
    assert get_decoder("shout") is upper
    with pytest.raises(ValueError, match="'shout' is already registered .*replace=True"):
        register_decoder("shout", upper)
    with pytest.raises(ValueError, match="'npy' is already registered"):
        register_decoder("npy", upper)
    register_decoder("npy", upper, replace=True)
    assert get_decoder("npy") is upper
    with pytest.raises(ValueError, match="without '.'"):
        register_decoder("a.b", upper)
    with pytest.raises(TypeError, match="callable"):
        register_decoder("x", 3)


def test_sample_decoder_snapshots_the_registry_and_takes_overrides():
    raw = {"a.shout": memoryview(b"hey"), "b.txt": memoryview(b"x")}
    before = SampleDecoder()
    register_decoder("shout", lambda b: bytes(b).upper())
    after = SampleDecoder()
    assert before(raw, "k", "s")["a"] == b"hey"
    assert after(raw, "k", "s")["a"] == b"HEY"
    custom = SampleDecoder(decoders={"TXT": lambda b: len(b)})
    assert custom(raw, "k", "s")["b"] == 1


# ------------------------------------------------------------------------------------------------
# SampleDecoder
# ------------------------------------------------------------------------------------------------


def _raw(i: int = 3) -> dict[str, memoryview]:
    return {ext: memoryview(data) for ext, data in sample_members(i, 0)}


def test_decode_with_schema():
    out = SampleDecoder(SCHEMA)(_raw(3), "t0000003", "s.tar")
    assert list(out) == ["__key__", "vec", "idx", "meta"]
    assert out["__key__"] == "t0000003"
    np.testing.assert_array_equal(out["vec"], np.array([30, 31, 32, 33], dtype=np.float32))
    assert out["vec"].dtype == np.float32
    assert type(out["idx"]) is np.int64 and out["idx"] == 3
    assert out["meta"] == {"i": 3, "shard": 0}
    assert SampleDecoder(SCHEMA).member_exts == ("vec.npy", "idx.cls", "meta.json")


def test_only_requested_fields_are_decoded():
    raw = _raw(1)
    raw["meta.json"] = memoryview(b"{not json")
    decoder = SampleDecoder(SCHEMA, fields=["vec", "idx"])
    out = decoder(raw, "k", "s.tar")
    assert list(out) == ["__key__", "vec", "idx"]
    assert decoder.member_exts == ("vec.npy", "idx.cls")
    with pytest.raises(DecodeError) as err:
        SampleDecoder(SCHEMA, fields=["meta"])(raw, "k9", "ds/train/shard-000002.tar")
    msg = str(err.value)
    assert msg.startswith("ds/train/shard-000002.tar: sample 'k9', field 'meta' (member k9.meta")
    assert "JSONDecodeError" in msg
    assert isinstance(err.value.__cause__, json.JSONDecodeError)


def test_unknown_field_with_schema_fails_at_construction():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['nope'\]; the schema has: "):
        SampleDecoder(SCHEMA, fields=["vec", "nope"])
    with pytest.raises(TypeError, match="sequence of field names"):
        SampleDecoder(SCHEMA, fields="vec")


def test_missing_member_names_key_and_field():
    raw = _raw(2)
    del raw["idx.cls"]
    with pytest.raises(DecodeError, match=r"s\.tar: sample 'k2' has no member 'idx\.cls' \(field"):
        SampleDecoder(SCHEMA)(raw, "k2", "s.tar")


def test_decode_without_schema_names_fields_after_the_extension():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, size=(2, 3, 3), dtype=np.uint8)
    raw = {
        "jpg": memoryview(b"opaque"),
        "seg.png": memoryview(_image_bytes(img, "PNG")),
        "vec.npy": memoryview(npy_bytes(np.ones(2, np.float64))),
        "cls": memoryview(b"4"),
    }
    out = SampleDecoder(fields=["seg", "cls", "vec"])(raw, "k", "s")
    assert list(out) == ["__key__", "seg", "cls", "vec"]
    np.testing.assert_array_equal(out["seg"], img)
    assert out["cls"] == 4 and type(out["cls"]) is int  # no schema: no cast
    with pytest.raises(DecodeError, match=r"s: sample 'k' has no field 'txt'; its fields: \["):
        SampleDecoder(fields=["txt"])(raw, "k", "s")
    with pytest.raises(DecodeError, match="field 'jpg'"):
        SampleDecoder()(raw, "k", "s")  # every field requested: the fake jpg fails


def test_two_members_for_one_field_without_schema():
    raw = {"a.npy": memoryview(npy_bytes(np.ones(1))), "a.json": memoryview(b"1")}
    with pytest.raises(DecodeError, match="two members for field 'a'"):
        SampleDecoder()(raw, "k", "s")


def test_schema_dtype_and_shape_are_checked_for_fixed_shapes():
    schema = {
        "emb": FieldSpec(ext="emb.npy", encoding="npy", dtype="float32", shape=[2, 3]),
        "free": FieldSpec(ext="free.npy", encoding="npy", dtype="float32", shape=["D"]),
    }
    ok = {
        "emb.npy": memoryview(npy_bytes(np.zeros((2, 3), np.float32))),
        "free.npy": memoryview(npy_bytes(np.zeros(5, np.float32))),  # D unbound: any size
    }
    out = SampleDecoder(schema)(ok, "k", "s")
    assert out["emb"].shape == (2, 3) and out["free"].shape == (5,)
    bad_dtype = dict(ok, **{"emb.npy": memoryview(npy_bytes(np.zeros((2, 3), np.float64)))})
    with pytest.raises(
        DecodeError,
        match=r"s\.tar: sample 'k7', field 'emb' .* does not match the schema: dtype float64, "
        r"schema says float32",
    ):
        SampleDecoder(schema)(bad_dtype, "k7", "s.tar")
    bad_shape = dict(ok, **{"emb.npy": memoryview(npy_bytes(np.zeros((3, 2), np.float32)))})
    with pytest.raises(DecodeError, match=r"shape \[3, 2\], schema says \[2, 3\]"):
        SampleDecoder(schema)(bad_shape, "k7", "s.tar")


def test_symbolic_dims_bound_by_the_manifest_are_checked_like_literal_sizes():
    schema = {
        "q": FieldSpec(ext="q.npy", encoding="npy", dtype="float32", shape=["D"]),
        "neg": FieldSpec(ext="neg.npy", encoding="npy", dtype="float32", shape=["N_neg", "D"]),
    }
    raw = {
        "q.npy": memoryview(npy_bytes(np.zeros(4, np.float32))),
        "neg.npy": memoryview(npy_bytes(np.zeros((7, 4), np.float32))),  # N_neg unbound: any
    }
    decoder = SampleDecoder(schema, dims={"D": 4})
    assert decoder(raw, "k", "s")["neg"].shape == (7, 4)
    short = dict(raw, **{"q.npy": memoryview(npy_bytes(np.zeros(3, np.float32)))})
    with pytest.raises(
        DecodeError,
        match=r"s\.tar: sample 'k7', field 'q' \(member k7\.q\.npy\) does not match the "
        r"schema: shape \[3\], schema says \['D'\] with D=4 \(the manifest's dims\)",
    ):
        decoder(short, "k7", "s.tar")
    wide = dict(raw, **{"neg.npy": memoryview(npy_bytes(np.zeros((7, 5), np.float32)))})
    with pytest.raises(DecodeError, match=r"shape \[7, 5\], schema says \['N_neg', 'D'\] with D=4"):
        decoder(wide, "k", "s")
    flat = dict(raw, **{"neg.npy": memoryview(npy_bytes(np.zeros(28, np.float32)))})
    with pytest.raises(DecodeError, match=r"field 'neg'.*shape \[28\], schema says"):
        decoder(flat, "k", "s")
    assert SampleDecoder(schema)(short, "k", "s")["q"].shape == (3,)  # no dims: not bound


def test_cls_is_cast_per_schema_dtype():
    schema = {"label": FieldSpec(ext="label.cls", encoding="cls", dtype="int8", shape=[])}
    out = SampleDecoder(schema)({"label.cls": memoryview(b"-5")}, "k", "s")
    assert type(out["label"]) is np.int8 and out["label"] == -5
    with pytest.raises(DecodeError, match=r"field 'label'.*value 300 does not fit dtype int8"):
        SampleDecoder(schema)({"label.cls": memoryview(b"300")}, "k", "s")
    plain = {"label": FieldSpec(ext="label.cls", encoding="cls", dtype="int")}
    assert SampleDecoder(plain)({"label.cls": memoryview(b"9")}, "k", "s")["label"] == 9


def test_decode_field():
    d = SampleDecoder(SCHEMA, fields=["idx"])
    np.testing.assert_array_equal(d.decode_field(_raw(4), "k", "s", "vec"), [40, 41, 42, 43])
    with pytest.raises(ValueError, match="unknown field 'x'"):
        d.decode_field(_raw(4), "k", "s", "x")
    assert SampleDecoder().decode_field(_raw(4), "k", "s", "meta") == {"i": 4, "shard": 0}


def test_unrequested_schema_fields_are_not_prepared():
    schema = dict(SCHEMA, odd=FieldSpec(ext="odd.npy", encoding="npy", dtype="no-such", shape=[1]))
    out = SampleDecoder(schema, fields=["idx"])(_raw(6), "k", "s")
    assert out == {"__key__": "k", "idx": 6}


@pytest.mark.parametrize(
    "doc",
    [b'{"a": 1}', b' {"a": 1}\n', '\ufeff{"a":2}'.encode(), '{"b":3}'.encode("utf-16"),
     b'[1, 2.5, "x"]', b'"s"', b"12", b"true", b"null"],
)  # fmt: skip
def test_json_decodes_exactly_like_json_loads(doc):
    from wdsloader.decode.codecs import decode_json

    assert decode_json(memoryview(doc)) == json.loads(doc)


@pytest.mark.parametrize("doc", [b'{"a": 1} x', b"", b"{", b"1 2", b"\xff{}"])
def test_json_errors_are_json_loads_errors(doc):
    from wdsloader.decode.codecs import decode_json

    with pytest.raises(ValueError) as ours:
        decode_json(memoryview(doc))
    with pytest.raises(ValueError) as theirs:
        json.loads(doc)
    assert str(ours.value) == str(theirs.value)


JSON_EDGES = [
    b'{"a":1,"a":2}', b"12345678901234567890123", b"-0.0", b"1e400", b"-1e400", b"NaN",
    b'[Infinity, -Infinity]', b'"\\ud800"', b'"\\u00e9\\ud83d\\ude00"', b"0.1", b"1E5",
    b'{"x": [1, {"y": null}], "z": "\xc3\xa9"}', '\ufeff{"a":2}'.encode(), b"  [1]\n",
    '{"b":3}'.encode("utf-16"), b"4.9406564584124654e-324", b"[" * 50 + b"]" * 50,
]  # fmt: skip


@pytest.mark.parametrize("doc", JSON_EDGES)
def test_json_values_and_types_are_json_loads(doc):
    """The same values and types as json.loads, whichever parser runs (msgspec when
    installed, the stdlib where msgspec refuses)."""
    from wdsloader.decode.codecs import decode_json

    ours, theirs = decode_json(memoryview(doc)), json.loads(doc)
    assert repr(ours) == repr(theirs)
    assert _types(ours) == _types(theirs)


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)
