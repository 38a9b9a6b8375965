"""Encode sample fields as tar members without pickle, and check every sample against a schema.

Encodings (the member extension is ``wdsloader.format.member_ext(field, encoding)``):

==============================================  =========================================
value                                           member
==============================================  =========================================
numpy array, torch tensor                       ``.npy`` (``allow_pickle=False``; object
                                                dtypes refused; C order, little-endian)
``str``                                         ``.txt`` (UTF-8)
``int``, numpy integer scalar                   ``.cls`` (decimal text)
``float``, ``bool``, ``list``, ``dict``, None   ``.json``
PIL image                                       ``.png``, or the field's ``.jpg``/``.png``/
                                                ``.webp``
``bytes``                                       only with an explicit extension in the
                                                field name: ``"image.jpg": b"..."``
==============================================  =========================================

A sample dict's names are field names, optionally with an explicit extension
(``"image.jpg"`` is the field ``image`` stored as ``jpg``). The schema is inferred from the first
sample and/or declared; :class:`SampleEncoder` checks every sample against it (field set,
encoding, dtype, shape with symbolic dims, NaN/Inf, declared ranges) and raises
:class:`~wdsloader.errors.SchemaError` naming the sample key and the field.

A value the loader could not give back as it was written is refused the same way: a ``.cls``
int outside the field's dtype (int64 for Python ints), a str that is not valid Unicode
(surrogates), raw bytes under ``.txt``/``.jsn``/``.id``-like extensions that their default
decoder cannot read, JSON with non-str dict keys, nesting deeper than 200 levels or a bare int
beyond int64, and a member name ``KEY.EXT`` over the 100-byte tar limit. Tuples in JSON read
back as lists, numpy values in JSON as Python numbers and lists.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from build_shards.errors import naming_options
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, member_ext, validate_field
from wdsloader.format.ustar import MAX_NAME_BYTES

IMAGE_FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "webp": "WEBP"}
_ENC_RE = re.compile(r"^[a-z0-9]+$")
_SPEC_KEYS = {"ext", "encoding", "dtype", "shape", "range"}
_HEADER_CACHE_MAX = 256
_NAMES_CACHE_MAX = 64  # sets of sample names already checked against the schema
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


def parse_name(name: Any) -> tuple[str, str | None]:
    """``(field, explicit_encoding)`` of a sample dict name such as ``"image.jpg"`` or ``"emb"``."""
    if not isinstance(name, str):
        raise SchemaError(f"field names must be strings, got {name!r}")
    head, dot, tail = name.rpartition(".")
    field, enc = (head, tail) if dot else (name, None)
    try:
        validate_field(field)
    except ValueError as exc:
        raise SchemaError(str(exc)) from None
    if enc is not None and not _ENC_RE.match(enc):
        raise SchemaError(
            f"invalid extension in field name {name!r}: use lower-case letters and digits"
        )
    return field, enc


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_pil(value: Any) -> bool:
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def _tensor_to_numpy(key: str, field: str, value: Any) -> np.ndarray:
    try:
        return value.detach().cpu().numpy()
    except (TypeError, RuntimeError) as exc:
        raise SchemaError(
            f"sample {key!r}: field {field!r}: tensor of dtype {value.dtype} has no numpy "
            f"equivalent ({exc}); convert it (e.g. .float()) in map"
        ) from None


def dtype_name(dt: np.dtype) -> str:
    """The schema's name of a numpy dtype (``float32``; ``<U8`` for fixed-width strings)."""
    return dt.name if dt.kind in "biufcmM" else dt.str


def _fmt_shape(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def infer_spec(key: str, field: str, explicit: str | None, value: Any) -> FieldSpec:
    """The FieldSpec of one value of the first sample."""

    def spec(encoding: str, dtype: str, shape: list[Any] | None = None) -> FieldSpec:
        if explicit is not None and explicit != encoding:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: a {type(value).__name__} value cannot be "
                f"stored as .{explicit} (it is stored as .{encoding})"
            )
        return FieldSpec(
            ext=member_ext(field, encoding), encoding=encoding, dtype=dtype, shape=shape
        )

    if _is_tensor(value):
        value = _tensor_to_numpy(key, field, value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.kind == "V":
            raise SchemaError(
                f"sample {key!r}: field {field!r}: arrays of dtype {value.dtype} are not stored "
                "(they would need pickle); convert them to a numeric or string dtype"
            )
        dt = value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype
        return spec("npy", dtype_name(dt), list(value.shape))
    if _is_pil(value):
        enc = explicit or "png"
        if enc not in IMAGE_FORMATS:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: images are stored as "
                f"{'/'.join(IMAGE_FORMATS)}, not .{enc}"
            )
        return FieldSpec(ext=member_ext(field, enc), encoding=enc, dtype="image")
    if isinstance(value, (bytes, bytearray, memoryview)):
        if explicit is None:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: bytes need an explicit extension in the field "
                f"name, e.g. '{field}.jpg' or '{field}.bin'"
            )
        return FieldSpec(ext=member_ext(field, explicit), encoding=explicit, dtype="bytes")
    if isinstance(value, str):
        enc = explicit or "txt"
        return FieldSpec(ext=member_ext(field, enc), encoding=enc, dtype="str")
    if isinstance(value, (bool, np.bool_)):
        return spec("json", "json")
    if isinstance(value, (int, np.integer)):
        if explicit == "json":
            return spec("json", "json")
        return spec("cls", "int" if isinstance(value, int) else value.dtype.name)
    if value is None or isinstance(value, (float, np.floating, list, tuple, dict)):
        return spec("json", "json")
    raise SchemaError(
        f"sample {key!r}: field {field!r}: values of type {type(value).__qualname__} cannot be "
        "stored without pickle; convert them in map (to an array, str, int, float, list, dict, "
        "bytes with an extension, or a PIL image)"
    )


def _coerce_spec(field: str, base: FieldSpec, declared: Any) -> FieldSpec:
    """A declared FieldSpec or dict merged over the inferred ``base``."""
    if isinstance(declared, FieldSpec):
        spec = dataclasses.replace(declared)
    elif isinstance(declared, Mapping):
        unknown = set(declared) - _SPEC_KEYS
        if unknown:
            raise ValueError(f"schema[{field!r}]: unknown keys {sorted(unknown)}")
        values = dataclasses.asdict(base)
        values.update(declared)
        if "encoding" in declared and "ext" not in declared:
            values["ext"] = member_ext(field, values["encoding"])
        if values["encoding"] != "npy" and "shape" not in declared:
            values["shape"] = None
        spec = FieldSpec(**values)
    else:
        raise TypeError(f"schema[{field!r}] must be a FieldSpec or a dict, got {declared!r}")
    if spec.ext != member_ext(field, spec.encoding):
        raise ValueError(
            f"schema[{field!r}]: ext {spec.ext!r} must be {member_ext(field, spec.encoding)!r}"
        )
    if spec.shape is not None:
        if spec.encoding != "npy":
            raise ValueError(f"schema[{field!r}]: a shape is only meaningful for npy fields")
        bad = [d for d in spec.shape if not isinstance(d, (int, str)) or isinstance(d, bool)]
        if bad:
            raise ValueError(
                f"schema[{field!r}]: shape dims must be ints or symbolic names, got {bad}; "
                "use shape=None for arrays of varying shape"
            )
    if spec.range is not None:
        if len(spec.range) != 2 or not spec.range[0] <= spec.range[1]:
            raise ValueError(f"schema[{field!r}]: range must be [low, high] with low <= high")
        if spec.encoding not in ("npy", "cls", "json"):
            raise ValueError(f"schema[{field!r}]: a range needs a numeric field")
    return spec


def build_schema(
    key: str,
    sample: Mapping[str, Any],
    declared: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
) -> tuple[dict[str, FieldSpec], dict[str, int]]:
    """``(schema, dims)`` from the first sample, with ``declared`` fields (FieldSpec or dict)
    taking precedence and unbound symbolic dims bound from the first sample's arrays.

    Fields of the first sample that are not declared are inferred; a declared field the first
    sample lacks is a SchemaError.
    """
    by_field: dict[str, tuple[str | None, Any]] = {}
    for name, value in sample.items():
        field, explicit = parse_name(name)
        if field in by_field:
            raise SchemaError(f"sample {key!r}: field {field!r} appears twice ({name!r})")
        by_field[field] = (explicit, value)
    schema = {f: infer_spec(key, f, ex, v) for f, (ex, v) in by_field.items()}
    bound = {str(k): int(v) for k, v in (dims or {}).items()}
    for name, decl in (declared or {}).items():
        field, explicit = parse_name(name)
        if field not in schema:
            raise SchemaError(
                f"sample {key!r}: declared field {field!r} is missing from the first sample "
                f"(it has {sorted(schema)})"
            )
        spec = _coerce_spec(field, schema[field], decl)
        if explicit is not None and spec.encoding != explicit:
            raise ValueError(f"schema[{name!r}]: encoding {spec.encoding!r} contradicts the name")
        schema[field] = spec
    for field, spec in schema.items():
        if spec.encoding != "npy" or spec.shape is None:
            continue
        value = by_field[field][1]
        actual = np.shape(value.numpy() if _is_tensor(value) else value)
        if len(actual) != len(spec.shape):
            raise SchemaError(
                f"sample {key!r}: field {field!r}: shape {_fmt_shape(actual)} does not match "
                f"the schema's {_fmt_shape(spec.shape)}"
            )
        for dim, size in zip(spec.shape, actual, strict=True):
            if isinstance(dim, str) and dim not in bound:
                bound[dim] = int(size)
    fixed = sorted(f for f, s in schema.items() if s.fixed_size)
    rest = sorted(f for f in schema if f not in fixed)
    return {f: schema[f] for f in fixed + rest}, bound


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


def _npy_encoder(field: str, spec: FieldSpec, dims: Mapping[str, int], allow_nan: bool) -> Encoder:
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
        if _is_tensor(value):
            value = _tensor_to_numpy(key, field, value)
        elif not isinstance(value, np.ndarray):
            if not isinstance(value, np.generic):
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: expected an array "
                    f"({spec.dtype} {_fmt_shape(spec.shape or [])}), got {type(value).__name__}"
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
                f"schema's {spec.dtype}"
            )
        if want_shape is not None and value.shape != want_shape:
            raise SchemaError(
                f"sample {key!r}: field {field!r}: shape {_fmt_shape(value.shape)} differs from "
                f"the schema's {_fmt_shape(spec.shape or [])} = {_fmt_shape(want_shape)}"
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

    def to_npy(value: np.ndarray) -> bytes:
        """The ``.npy`` bytes (C order): the header is made once per (dtype, shape)."""
        # once checked, the dtype is the schema's when it names one
        hkey = value.shape if want_dtype is not None else (value.dtype.str, value.shape)
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
        return to_npy(value), nonfinite

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


def _cls_encoder(field: str, spec: FieldSpec) -> Encoder:
    low, high, dtype = _int_bounds(spec.dtype)

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise SchemaError(
                f"sample {key!r}: field {field!r}: expected an int (.cls), got "
                f"{type(value).__name__} {value!r:.40}"
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
    if _is_tensor(value):
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


def _json_encoder(field: str, spec: FieldSpec, allow_nan: bool) -> Encoder:
    strict, lenient = _json_text_encoder(False), _json_text_encoder(True)

    def encode(key: str, value: Any) -> tuple[bytes, bool]:
        if isinstance(value, np.generic):
            value = value.item()
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


def _bytes_encoder(field: str, spec: FieldSpec) -> Encoder:
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
        if fmt is not None and _is_pil(value):
            buf = io.BytesIO()
            img = value
            if fmt == "JPEG" and img.mode not in ("RGB", "L", "CMYK"):
                img = img.convert("RGB")
            img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
            return buf.getvalue(), False
        want = "str" if spec.dtype == "str" else "bytes or a PIL image" if fmt else "bytes"
        raise SchemaError(
            f"sample {key!r}: field {field!r}: expected {want} (.{spec.encoding}), got "
            f"{type(value).__name__}"
        )

    return encode


def make_encoder(field: str, spec: FieldSpec, dims: Mapping[str, int], allow_nan: bool) -> Encoder:
    """The checking encoder of one field."""
    if spec.encoding == "npy":
        return _npy_encoder(field, spec, dims, allow_nan)
    if spec.encoding == "cls":
        return _cls_encoder(field, spec)
    if spec.encoding == "json":
        return _json_encoder(field, spec, allow_nan)
    return _bytes_encoder(field, spec)


class SampleEncoder:
    """Checks samples against ``schema`` and turns them into ordered tar members.

    Members come in the same order in every sample: fixed-size fields (npy with a fixed shape)
    sorted by field name, then the others sorted by name; the schema dict is in that order.
    """

    def __init__(
        self, schema: Mapping[str, FieldSpec], dims: Mapping[str, int], *, allow_nan: bool = False
    ) -> None:
        self.schema = dict(schema)
        self.dims = dict(dims)
        self.allow_nan = allow_nan
        for spec in self.schema.values():
            for d in spec.shape or ():
                if isinstance(d, str) and d not in self.dims:
                    raise SchemaError(f"symbolic dim {d!r} is not bound (pass dims={{{d!r}: N}})")
        fixed = sorted(f for f, s in self.schema.items() if s.fixed_size)
        self.order: list[str] = fixed + sorted(f for f in self.schema if f not in fixed)
        self._setup()

    def _setup(self) -> None:
        self._exts = [self.schema[f].ext for f in self.order]
        # a key longer than this many characters may make a member name over the tar limit
        self._safe_key_len = (MAX_NAME_BYTES - 1 - max(map(len, self._exts), default=0)) // 4
        self._encoders = [
            make_encoder(f, self.schema[f], self.dims, self.allow_nan) for f in self.order
        ]
        self._names: dict[str, tuple[str, str | None]] = {}
        self._orders: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "dims": self.dims,
            "allow_nan": self.allow_nan,
            "order": self.order,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _parse(self, name: str) -> tuple[str, str | None]:
        got = self._names.get(name)
        if got is None:
            got = self._names[name] = parse_name(name)
        return got

    def _check_names(self, key: str, names: tuple[str, ...]) -> tuple[str, ...]:
        """The sample's names in member order, or SchemaError when they do not fit the schema
        (an explicit extension other than the schema's, a field twice, missing or extra)."""
        by_field: dict[str, str] = {}
        for name in names:
            field, explicit = self._parse(name)
            spec = self.schema.get(field)
            if spec is not None and explicit is not None and explicit != spec.encoding:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: stored as .{explicit} here but as "
                    f".{spec.encoding} in the schema"
                )
            if field in by_field:
                raise SchemaError(f"sample {key!r}: field {field!r} appears twice")
            by_field[field] = name
        if len(by_field) != len(self.order) or any(f not in by_field for f in self.order):
            missing = sorted(f for f in self.order if f not in by_field)
            extra = sorted(f for f in by_field if f not in self.schema)
            raise SchemaError(
                f"sample {key!r}: fields differ from the schema: missing {missing}, "
                f"unexpected {extra}"
            )
        return tuple(by_field[f] for f in self.order)

    def _check_member_names(self, key: str) -> None:
        """SchemaError unless every member name ``KEY.EXT`` fits a tar header."""
        try:
            nkey = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise SchemaError(f"sample {key!r}: the key is not valid Unicode ({exc})") from None
        for field, ext in zip(self.order, self._exts, strict=True):
            if nkey + 1 + len(ext.encode("utf-8")) > MAX_NAME_BYTES:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: the member name {key}.{ext} is longer "
                    f"than {MAX_NAME_BYTES} bytes (the tar name limit): use a shorter key or "
                    "field name"
                )

    def encode(self, key: str, sample: Mapping[str, Any]) -> tuple[list[tuple[str, bytes]], bool]:
        """``(members, nonfinite)`` for one sample; ``nonfinite`` is True when a float held NaN
        or Inf (only possible with ``allow_nan``)."""
        names = tuple(sample)
        ordered = self._orders.get(names)
        if ordered is None:  # the names are checked once per set (and order) of names
            ordered = self._check_names(key, names)
            if len(self._orders) < _NAMES_CACHE_MAX:
                self._orders[names] = ordered
        if len(key) > self._safe_key_len:
            self._check_member_names(key)
        members: list[tuple[str, bytes]] = []
        nonfinite = False
        for name, ext, enc in zip(ordered, self._exts, self._encoders, strict=True):
            data, bad = enc(key, sample[name])
            members.append((ext, data))
            nonfinite = nonfinite or bad
        return members, nonfinite
