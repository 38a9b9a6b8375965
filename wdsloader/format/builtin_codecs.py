"""The library's pure codecs (Python and numpy only): ``npy``, ``json``/``jsn``, ``txt``/``text``
and ``cls``/``cls2``/``index``/``id``, registered with :mod:`wdsloader.format.codecs` on import.

Their ``encode`` writes the bytes ``build_shards`` writes for a valid value (the builder adds its
schema checks on top: dtype, shape, NaN, ranges); their decode functions are the loader's.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from wdsloader.errors import PickleNotAllowedError
from wdsloader.format.codecs import FunctionCodec, register_library_codec
from wdsloader.format.npy import read_npy_header

Buffer = bytes | bytearray | memoryview

PICKLE_HINT = "pass allow_pickle=True if you trust the data"


def decode_npy(buf: Buffer) -> np.ndarray:
    """A ``.npy`` member as a writable array that owns its memory; never unpickles.

    The header is parsed here (and cached by its bytes) instead of by ``np.load``, which costs
    tens of microseconds per call. An object dtype raises :class:`PickleNotAllowedError`.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    dtype, shape, fortran, offset = read_npy_header(view)
    if dtype.hasobject:
        raise PickleNotAllowedError(
            f"the .npy array has dtype {dtype} (Python objects), which needs pickle to load; "
            + PICKLE_HINT
        )
    count = math.prod(shape)
    need = count * dtype.itemsize
    if len(view) - offset < need:
        raise ValueError(
            f".npy data truncated: {len(view) - offset} bytes for shape {shape} of {dtype} "
            f"({need} bytes)"
        )
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    out: np.ndarray
    if fortran:
        out = flat.reshape(shape[::-1]).T.copy(order="F")
    else:
        out = flat.reshape(shape).copy()
    return out


def encode_npy(value: Any) -> bytes:
    """An array as ``.npy`` bytes: C order, little-endian, no pickle (object dtypes refused)."""
    arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.kind == "V":
        raise TypeError(f"dtype {arr.dtype} is not stored (it needs pickle)")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    buf = io.BytesIO()
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    np.save(buf, arr if arr.flags.c_contiguous else arr.copy(order="C"), allow_pickle=False)
    return buf.getvalue()


_SCAN_JSON = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _msgspec_json() -> tuple[Callable[[Any], Any] | None, tuple[type[Exception], ...]]:
    """msgspec's JSON decoder and its error type, when msgspec is installed (optional: 3x the
    stdlib's C scanner on small objects; bench/experiments/json_parsers.py)."""
    try:
        import msgspec
    except ImportError:
        return None, ()
    return msgspec.json.Decoder().decode, (msgspec.MsgspecError,)


FAST_JSON, FAST_JSON_ERRORS = _msgspec_json()


def decode_json(buf: Buffer) -> Any:
    """A JSON member, exactly as ``json.loads`` reads it (UTF-8, a BOM or UTF-16/32 included).

    With msgspec installed, msgspec decodes it (the same values and types: exact big ints,
    correctly rounded floats, the last of duplicate keys); anything msgspec refuses (NaN and
    Infinity, numbers beyond float range, lone surrogates, a BOM, UTF-16/32, invalid JSON)
    goes the stdlib way, which also words the errors. Without msgspec, a UTF-8 document without
    surrounding whitespace goes straight to the C scanner, skipping ``json.loads``' Python
    layers.
    """
    if FAST_JSON is not None:
        try:
            return FAST_JSON(buf)
        except FAST_JSON_ERRORS:
            pass
    try:
        text = str(buf, "utf-8")
        value, end = _SCAN_JSON(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(bytes(buf))
    if end != len(text):
        return json.loads(bytes(buf))
    return value


def json_default(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (for ``json.JSONEncoder``)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return value.tolist()
    if callable(getattr(value, "tolist", None)):  # a torch tensor
        return value.tolist()
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


_JSON = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=json_default
)


def encode_json(value: Any) -> bytes:
    """A value as compact UTF-8 JSON (NaN and Inf refused)."""
    return _JSON.encode(value.item() if isinstance(value, np.generic) else value).encode()


def decode_text(buf: Buffer) -> str:
    """A UTF-8 text member as ``str``."""
    return str(buf, "utf-8")


def encode_text(value: Any) -> bytes:
    """A ``str`` as UTF-8 (bytes stored as they are)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {type(value).__name__}")
    return value.encode("utf-8")


def decode_int(buf: Buffer) -> int:
    """A class label / index member (ASCII digits, surrounding whitespace allowed) as ``int``."""
    return int(bytes(buf))


def encode_int(value: Any) -> bytes:
    """An int as decimal ASCII digits."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return str(int(value)).encode()


def decode_bytes(buf: Buffer) -> bytes:
    """Any other member: its raw bytes (a copy, so the shard buffer is not kept alive)."""
    return bytes(buf)


NPY = FunctionCodec("npy", decode_npy, encoder=encode_npy, fixed_width=True)
JSON = FunctionCodec("json", decode_json, encodings=("json", "jsn"), encoder=encode_json)
TEXT = FunctionCodec("txt", decode_text, encodings=("txt", "text"), encoder=encode_text)
INT = FunctionCodec("cls", decode_int, encodings=("cls", "cls2", "index", "id"), encoder=encode_int)
for _codec in (NPY, JSON, TEXT, INT):
    register_library_codec(_codec)
