"""The checking encoder of one field: its value as member bytes, or a SchemaError naming the
sample key and the field (see :mod:`build_shards.encode.sample` for the encodings).

These are the library codecs' checking encoders;
:func:`build_shards.encode.field_encoder.make_encoder` picks a field's encoder from the codec
registry."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from build_shards.encode.schema import (
    IMAGE_FORMATS,
    declare_hint,
    dtype_name,
    fmt_shape,
    is_pil,
    is_tensor,
    tensor_to_numpy,
)
from build_shards.errors import naming_options
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec
from wdsloader.format.codecs import registered_encodings

_HEADER_CACHE_MAX = 256
_INT64 = np.dtype(np.int64)
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_JSON_MAX_DEPTH = 200  # deeper JSON may overflow the reader's recursion limit
_CONTAINERS = (dict, list, tuple)
_JSON_LEAVES = frozenset({str, int, float, bool, type(None)})
# raw bytes stored under these encodings are checked as the loader's default decoder reads them
_CHECKED_BYTES = {
    "txt": "text",
    "text": "text",
    "jsn": "json",
    "json": "json",
    "cls2": "int",
    "index": "int",
    "id": "int",
}

Encoder = Callable[[str, Any], tuple[bytes, bool]]


# ------------------------------------------------------------------------------------------------
# Per-field encoders
# ------------------------------------------------------------------------------------------------


def _range_error(key: str, field: str, spec: FieldSpec, lo: float, hi: float) -> SchemaError:
    return SchemaError(
        f"sample {key!r}: field {field!r}: values in [{lo}, {hi}] fall outside the declared "
        f"range {spec.range}"
    )


def _nan_error(key: str, field: str) -> SchemaError:
    return naming_options(
        SchemaError(
            f"sample {key!r}: field {field!r}: NaN or Inf value (pass allow_nan=True to keep such "
            "samples; they are counted in the manifest)"
        ),
        "allow_nan",
    )


def _is_plain(dt: np.dtype) -> bool:
    """True for dtypes stored as they are: no objects, no void records, not big-endian."""
    return not dt.hasobject and dt.kind != "V" and dt.byteorder != ">"


def all_finite(value: np.ndarray) -> bool:
    """True when no element of ``value`` is NaN or ±Inf.

    Real float arrays first get one BLAS dot product of the values with themselves: NaN and Inf
    propagate into it and nothing cancels them (every term is >= 0), so a finite result proves
    every value finite. A non-finite result (or an overflow of large finite values) falls back to
    the exact element-wise check.
    """
    if value.dtype.kind == "f" and value.dtype.itemsize >= 4:
        flat = value.reshape(-1)
        if math.isfinite(flat.dot(flat)):
            return True
    return bool(np.isfinite(value).all())


def _npy_bytes(value: np.ndarray, headers: dict[Any, bytes], hkey: Any) -> bytes:
    """The ``.npy`` bytes of ``value`` (C order); its header is made once per ``hkey`` (dtype and
    shape) and kept in ``headers``."""
    header = headers.get(hkey)
    if header is None:
        buf = io.BytesIO()
        # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
        contiguous = value if value.flags.c_contiguous else value.copy(order="C")
        np.save(buf, contiguous, allow_pickle=False)
        full = buf.getvalue()
        if len(headers) < _HEADER_CACHE_MAX:
            headers[hkey] = full[: len(full) - value.nbytes]
        return full
    if value.flags.c_contiguous:
        # the array is a buffer (numpy's stubs do not say so); one copy of the data
        return b"".join((header, cast(bytes, value)))
    return header + value.tobytes()


def npy_encoder(field: str, spec: FieldSpec, dims: Mapping[str, int], allow_nan: bool) -> Encoder:
    want_dtype = np.dtype(spec.dtype) if spec.dtype is not None else None
    want_shape = (
        None
        if spec.shape is None
        else tuple(dims[d] if isinstance(d, str) else d for d in spec.shape)
    )
    # ndarrays of the schema's dtype (when stored as it is) skip conversion and dtype checks
    fast = want_dtype is not None and _is_plain(want_dtype)
    floats = want_dtype is None or want_dtype.kind in "fc"  # values that may be NaN or Inf
    headers: dict[Any, bytes] = {}

    def as_array(key: str, value: Any) -> np.ndarray:
        """``value`` as a little-endian ndarray of the schema's dtype and shape, or SchemaError."""
        if is_tensor(value):
            value = tensor_to_numpy(key, field, value)
        elif not isinstance(value, np.ndarray):
            if not isinstance(value, np.generic):
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: expected an array "
                    f"({spec.dtype} {fmt_shape(spec.shape or [])}), got {type(value).__name__}"
                )
            value = np.asarray(value)
        dt = value.dtype
        if dt.hasobject or dt.kind == "V":
            raise SchemaError(
                f"sample {key!r}: field {field!r}: dtype {dt} is not stored (needs pickle)"
            )
        if dt.byteorder == ">":
            value = value.astype(dt.newbyteorder("<"))
            dt = value.dtype
        if want_dtype is not None and dt != want_dtype:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: dtype {dtype_name(dt)} differs from the "
                f"schema's {spec.dtype}{declare_hint(field, dtype=None)}"
            )
        if want_shape is not None and value.shape != want_shape:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: shape {fmt_shape(value.shape)} differs from "
                f"the schema's {fmt_shape(spec.shape or [])} = {fmt_shape(want_shape)}"
                + declare_hint(field, shape=None)
            )
        return value

    def check_range(key: str, value: np.ndarray, nonfinite: bool) -> None:
        if spec.range is None or not value.size:
            return
        vals = value[np.isfinite(value)] if nonfinite else value
        if vals.size:
            lo, hi = vals.min(), vals.max()
            if lo < spec.range[0] or hi > spec.range[1]:
                raise _range_error(key, field, spec, lo, hi)

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if not (
            fast
            and type(value) is np.ndarray
            and value.dtype == want_dtype
            and (want_shape is None or value.shape == want_shape)
        ):
            value = as_array(key, value)
        nonfinite = floats and value.dtype.kind in "fc" and not all_finite(value)
        if nonfinite and not allow_nan:
            raise _nan_error(key, field)
        check_range(key, value, nonfinite)
        # once checked, the dtype is the schema's when it names one
        hkey = value.shape if want_dtype is not None else (value.dtype.str, value.shape)
        return _npy_bytes(value, headers, hkey), nonfinite

    return encode


def _check_number_range(key: str, field: str, spec: FieldSpec, value: Any) -> None:
    if spec.range is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if value < spec.range[0] or value > spec.range[1]:
        raise _range_error(key, field, spec, value, value)


def _int_bounds(dtype: str | None) -> tuple[int, int, str]:
    """``(low, high, dtype name)`` of the ints the loader can give back for a ``cls`` field of
    schema dtype ``dtype`` (``int`` and unknown names read back as int64)."""
    try:
        dt = np.dtype(dtype) if dtype not in (None, "int") else _INT64
    except TypeError:
        dt = _INT64
    if dt.kind not in "iu":
        dt = _INT64
    info = np.iinfo(dt)
    return int(info.min), int(info.max), dt.name


def cls_encoder(field: str, spec: FieldSpec) -> Encoder:
    low, high, dtype = _int_bounds(spec.dtype)

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            numbers = isinstance(value, (float, np.floating)) and not isinstance(value, bool)
            raise SchemaError(
                f"sample {key!r}: field {field!r}: expected an int (.cls), got "
                f"{type(value).__name__} {value!r:.40}"
                + declare_hint(field, encoding="json", **({"dtype": "float64"} if numbers else {}))
            )
        value = int(value)
        if not low <= value <= high:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: int {str(value)[:40]} does not fit the field's "
                f"dtype {dtype} ([{low}, {high}]): the loader could not read it back; store "
                "it as a str or an array of another dtype"
            )
        _check_number_range(key, field, spec, value)
        return str(value).encode(), False

    return encode


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return value.tolist()
    if is_tensor(value):
        return value.tolist()
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


def _json_text_encoder(allow_nan: bool) -> json.JSONEncoder:
    """The encoder ``json.dumps(value, ensure_ascii=False, separators=(",", ":"), ...)`` makes,
    built once (``dumps`` with options builds one per call)."""
    return json.JSONEncoder(
        ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan, default=_json_default
    )


def _json_problem(value: Any) -> str | None:
    """Why ``value`` would not read back from JSON as it was written, or None.

    Dict keys must be str (JSON turns ``{1: x}`` into ``{"1": x}``), nesting stays within
    ``_JSON_MAX_DEPTH`` (deeper documents overflow the reader's recursion), and a bare int
    (which the default collator stacks into int64) must fit int64. Ints inside lists and dicts
    are read back as Python ints, so they may be of any size.
    """
    if type(value) is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            return f"int {str(value)[:40]} does not fit int64 (the collator's dtype for ints)"
        return None
    if not isinstance(value, _CONTAINERS):
        return None
    return _container_problem(value, 1)


def _container_problem(item: Any, depth: int) -> str | None:
    if depth > _JSON_MAX_DEPTH:
        return f"nested deeper than {_JSON_MAX_DEPTH} levels"
    if isinstance(item, dict):
        for k in item:
            if type(k) is not str and not isinstance(k, str):
                return (
                    f"dict key {k!r:.40} is a {type(k).__name__}: JSON reads it back as a "
                    "str; convert the keys to str"
                )
        item = item.values()
    for v in item:
        if type(v) not in _JSON_LEAVES and isinstance(v, _CONTAINERS):
            problem = _container_problem(v, depth + 1)
            if problem is not None:
                return problem
    return None


def json_encoder(field: str, spec: FieldSpec, dims: Mapping[str, int], allow_nan: bool) -> Encoder:
    strict, lenient = _json_text_encoder(False), _json_text_encoder(True)
    floats = spec.dtype == "float64"  # numbers: ints are written as floats (1 -> 1.0)

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if isinstance(value, np.generic):
            value = value.item()
        if floats and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: expected a number (.json float64), got "
                    f"{type(value).__name__} {value!r:.40}{declare_hint(field, dtype='json')}"
                )
            try:
                value = float(value)
            except OverflowError:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: int {str(value)[:40]} is too large for a "
                    "float64"
                ) from None
        problem = _json_problem(value)
        if problem is not None:
            raise SchemaError(f"sample {key!r}: field {field!r}: {problem}")
        try:
            text = strict.encode(value)
            nonfinite = False
        except ValueError as exc:
            if "Out of range float" not in str(exc):
                raise SchemaError(f"sample {key!r}: field {field!r}: {exc}") from None
            if not allow_nan:
                raise _nan_error(key, field) from None
            text = lenient.encode(value)
            nonfinite = True
        except (TypeError, RecursionError) as exc:
            raise SchemaError(f"sample {key!r}: field {field!r}: {exc}") from None
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: a str is not valid Unicode ({exc})"
            ) from None
        if spec.range is not None:
            _check_number_range(key, field, spec, value)
        return data, nonfinite

    return encode


def _check_bytes(key: str, field: str, encoding: str, data: bytes) -> None:
    """Refuse raw bytes the loader's default decoder for ``encoding`` could not read."""
    kind = _CHECKED_BYTES.get(encoding)
    if kind is None:
        return
    try:
        if kind == "text":
            data.decode("utf-8")
        elif kind == "json":
            json.loads(data)
        else:
            if not _INT64_MIN <= int(data) <= _INT64_MAX:
                raise ValueError("the int does not fit int64")
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise SchemaError(
            f"sample {key!r}: field {field!r}: these bytes are not valid .{encoding} "
            f"({kind}) and the loader could not read them back: {exc}"
        ) from None


def bytes_encoder(field: str, spec: FieldSpec, known: bool = True) -> Encoder:
    fmt = IMAGE_FORMATS.get(spec.encoding)
    checked = spec.encoding in _CHECKED_BYTES

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            if checked:
                _check_bytes(key, field, spec.encoding, data)
            return data, False
        if isinstance(value, str) and spec.dtype == "str":
            try:
                return value.encode("utf-8"), False
            except UnicodeEncodeError as exc:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: a str is not valid Unicode ({exc})"
                ) from None
        if fmt is not None and is_pil(value):
            buf = io.BytesIO()
            img = value
            if fmt == "JPEG" and img.mode not in ("RGB", "L", "CMYK"):
                img = img.convert("RGB")
            img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
            return buf.getvalue(), False
        want = "str" if spec.dtype == "str" else "bytes or a PIL image" if fmt else "bytes"
        if not known:  # no codec: only bytes (and str) can be stored under this encoding
            raise SchemaError(
                f"sample {key!r}: field {field!r}: expected {want} (.{spec.encoding}), got "
                f"{type(value).__name__}, and no codec is registered for encoding "
                f"{spec.encoding!r} (registered: {', '.join(registered_encodings())}); "
                "register one with wdsloader.format.register_codec"
            )
        raise SchemaError(
            f"sample {key!r}: field {field!r}: expected {want} (.{spec.encoding}), got "
            f"{type(value).__name__}{declare_hint(field, encoding='json')}"
        )

    return encode
