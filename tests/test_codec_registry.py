"""One codec registry pairs encode and decode: a codec registered once is used by build_shards to
write a field of its encoding and by the loader to read it back; the library's codecs write the
bytes the builder writes and read back the value written; an encoding without a codec is a
clear error naming the field; pickle stays refused unless the caller opts in."""

from __future__ import annotations

import pickle
import tarfile
from typing import Any

import numpy as np
import pytest

from build_shards import build_shards
from build_shards.encode.field_encoder import make_encoder
from wdsloader import create_loader
from wdsloader.decode.codecs import DEFAULT_DECODERS
from wdsloader.decode.registry import SampleDecoder, get_decoder
from wdsloader.errors import PickleNotAllowedError, SchemaError
from wdsloader.format import (
    FieldSpec,
    get_codec,
    register_codec,
    registered_encodings,
    unregister_codec,
)
from wdsloader.format.codecs import library_decoders


class RevCodec:
    """A made-up encoding ``rev``: bytes (or a str as UTF-8) stored reversed."""

    name = "rev"
    encodings = ("rev",)
    fixed_width = False

    def encode(self, value: Any, spec: FieldSpec) -> bytes:
        if isinstance(value, str):
            value = value.encode("utf-8")
        if not isinstance(value, bytes):
            raise TypeError(f"rev stores bytes or str, not {type(value).__name__}")
        return value[::-1]

    def decode(self, data: Any, spec: FieldSpec | None) -> bytes:
        return bytes(data)[::-1]


REV = RevCodec()


@pytest.fixture
def rev():
    register_codec(REV)
    yield REV
    unregister_codec(REV)
    assert get_codec("rev") is None


def _as_list(samples: list[dict]) -> list[dict]:
    return samples


def _read(root, num_workers: int = 0, context: str | None = None) -> dict[str, dict]:
    loader = create_loader(
        root, "train", batch_size=2, shuffle=False, drop_last=False, pin_memory=False,
        collate_fn=_as_list, num_workers=num_workers, multiprocessing_context=context,
    )  # fmt: skip
    return {s["__key__"]: s for batch in loader for s in batch}


def _members(root) -> dict[str, bytes]:
    out = {}
    for shard in sorted((root / "train").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_a_user_codec_is_used_by_the_build_and_by_the_loader(tmp_path, rev, workers):
    samples = [{"__key__": f"k{i}", "payload.rev": f"hello {i}".encode(), "n": i} for i in range(5)]
    manifest = build_shards(samples, tmp_path, splits={"train": 1.0}, workers=workers)
    spec = manifest.schema["payload"]
    assert (spec.ext, spec.encoding, spec.dtype) == ("payload.rev", "rev", None)
    members = _members(tmp_path)
    assert members["k3.payload.rev"] == b"3 olleh"  # the codec's bytes, in every worker
    back = _read(tmp_path)
    assert {k: (s["payload"], s["n"]) for k, s in back.items()} == {
        f"k{i}": (f"hello {i}".encode(), i) for i in range(5)
    }


@pytest.mark.parametrize("context", [None, "spawn"])
def test_a_user_codec_decodes_in_loader_workers(tmp_path, rev, context):
    samples = [{"__key__": f"k{i}", "payload.rev": b"abc" * i} for i in range(4)]
    build_shards(samples, tmp_path, splits={"train": 1.0})
    back = _read(tmp_path, num_workers=1, context=context)  # spawn: the codec travels by pickle
    assert {k: s["payload"] for k, s in back.items()} == {f"k{i}": b"abc" * i for i in range(4)}


def test_a_field_declared_with_a_user_encoding_goes_through_its_codec(tmp_path, rev):
    samples = [{"__key__": f"k{i}", "note": f"é{i}"} for i in range(3)]
    build_shards(samples, tmp_path, splits={"train": 1.0}, schema={"note": {"encoding": "rev"}})
    assert _members(tmp_path)["k1.note.rev"] == "é1".encode()[::-1]
    assert {k: s["note"] for k, s in _read(tmp_path).items()} == {
        f"k{i}": f"é{i}".encode() for i in range(3)
    }


def test_a_value_the_user_codec_refuses_names_the_sample_and_field(tmp_path, rev):
    samples = [{"__key__": "k0", "note": "ok"}, {"__key__": "k1", "note": 3}]
    with pytest.raises(
        SchemaError,
        match=r"sample 'k1': field 'note': codec 'rev' cannot encode this int: rev stores "
        r"bytes or str, not int",
    ):
        build_shards(samples, tmp_path, splits={"train": 1.0}, schema={"note": {"encoding": "rev"}})


def test_an_encoding_without_a_codec_is_an_error_naming_the_field_and_the_codecs(tmp_path):
    samples = [{"__key__": "k0", "row": [1, 2]}]
    with pytest.raises(SchemaError) as info:
        build_shards(samples, tmp_path, splits={"train": 1.0}, schema={"row": {"encoding": "csv"}})
    message = str(info.value)
    assert "sample 'k0': field 'row': expected bytes (.csv), got list, and no codec is " in message
    assert "registered for encoding 'csv' (registered: bmp, cls, cls2, " in message
    assert "json, " in message and "npy, " in message and "register_codec" in message
    # bytes under an encoding without a codec stay the WebDataset convention: stored as they are
    build_shards([{"__key__": "k0", "blob.csv": b"1,2"}], tmp_path / "ok", splits={"train": 1.0})
    blob = _read(tmp_path / "ok")["k0"]["blob"]  # read as uint8 (DecodeOptions.raw_bytes)
    assert blob.dtype == np.uint8 and blob.tobytes() == b"1,2"


def test_registering_checks_the_codec_and_refuses_a_taken_encoding(rev):
    with pytest.raises(ValueError, match=r"encodings already have a codec: 'rev' \(rev\); pass"):
        register_codec(RevCodec())
    with pytest.raises(ValueError, match=r"'json' \(json\)"):
        register_codec(type("J", (RevCodec,), {"encodings": ("json",)})())
    with pytest.raises(TypeError, match="a codec needs name, encodings"):
        register_codec(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="encoding 'Rev.x' must be lower-case"):
        register_codec(type("R", (RevCodec,), {"encodings": ("Rev.x",)})())
    assert "rev" in registered_encodings()


def test_a_codec_replacing_a_library_one_is_used_and_unregistering_restores_it(tmp_path):
    shout = type("Shout", (RevCodec,), {"name": "shout", "encodings": ("txt",)})()
    library = get_codec("txt")
    register_codec(shout, replace=True)
    try:
        assert get_codec("txt") is shout
        build_shards([{"__key__": "k0", "t": "abc"}], tmp_path, splits={"train": 1.0})
        assert _members(tmp_path)["k0.t.txt"] == b"cba"
        assert _read(tmp_path)["k0"]["t"] == b"abc"
    finally:
        unregister_codec(shout)
    assert get_codec("txt") is library
    assert get_decoder("txt") is DEFAULT_DECODERS["txt"]


VALUES = {
    "npy": [np.arange(6, dtype=">i4").reshape(2, 3), np.float32(1.5), np.zeros((0, 2), "u1")],
    "json": [{"a": [1, 2.5, None, True]}, "été", [], 3, None],
    "cls": [0, -7, 2**62, np.int16(-3)],
    "txt": ["", "été ✓", "nul\x00"],
}


@pytest.mark.parametrize("encoding", sorted(VALUES))
def test_library_codecs_write_the_builder_s_bytes_and_read_back_the_value(encoding):
    codec = get_codec(encoding)
    assert codec is not None
    for value in VALUES[encoding]:
        dtype = {"npy": None, "json": "json", "cls": "int", "txt": "str"}[encoding]
        spec = FieldSpec(ext=f"f.{encoding}", encoding=encoding, dtype=dtype)
        data = codec.encode(value, spec)
        assert make_encoder("f", spec, {}, False)("k", value) == (data, False)
        back = codec.decode(memoryview(data), spec)
        if encoding == "npy":
            assert back.dtype == np.asarray(value).dtype.newbyteorder("<")
            np.testing.assert_array_equal(back, value)
        else:
            assert back == (value.item() if isinstance(value, np.generic) else value)


def test_the_loader_s_default_table_is_the_library_codecs_decoders():
    assert DEFAULT_DECODERS == library_decoders()
    assert set(DEFAULT_DECODERS) == set(registered_encodings())


def test_pickle_stays_refused_unless_the_caller_opts_in():
    data = pickle.dumps({"x": 1})
    for enc in ("pkl", "pickle", "pyd"):
        codec = get_codec(enc)
        assert codec is not None
        with pytest.raises(PickleNotAllowedError, match="refused by default"):
            codec.decode(data, None)
    raw = {"pkl": data}
    with pytest.raises(PickleNotAllowedError):
        SampleDecoder()(raw, "k", "shard")
    assert SampleDecoder(allow_pickle=True)(raw, "k", "shard")["pkl"] == {"x": 1}
