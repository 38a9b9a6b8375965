"""The build schema: field names with optional extensions, a spec inferred from a value, and
declared specs merged over the inferred ones (``finish_schema``; :mod:`build_shards.probe.infer`
infers from the first rows); see :mod:`build_shards.encode.sample` for the encodings."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, member_ext, validate_field
from wdsloader.format.codecs import get_codec, is_fixed_width, is_library_codec
from wdsloader.format.groups import GROUP_EXT, GROUP_FIELD, MIN_GROUPED, SMALL_TEXT_BYTES

IMAGE_FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "webp": "WEBP"}
_ENC_RE = re.compile(r"^[a-z0-9]+$")
_SPEC_KEYS = {"ext", "encoding", "dtype", "shape", "range", "optional"}
# the dtype a field declared with only an encoding gets
_DEFAULT_DTYPES = {"json": "json", "txt": "str", "cls": "int"}
INFER_ROWS = 1000
"""The schema is inferred from up to this many first samples (see :mod:`build_shards.probe.infer`)."""


def declare_hint(field: str, **spec: Any) -> str:
    """The end of an error about a value that does not fit the schema: how to declare ``field``
    (``spec``: an example declaration)."""
    example = {field: spec}
    return (
        f" (the schema was inferred from the first samples, up to {INFER_ROWS:,}; declare the "
        f"field: build_shards(schema={example!r}), or build-shards build --schema FILE with "
        f"{json.dumps(example)} in FILE (JSON or YAML))"
    )


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


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_pil(value: Any) -> bool:
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def tensor_to_numpy(key: str, field: str, value: Any) -> np.ndarray:
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


def fmt_shape(shape: Any) -> str:
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

    if explicit is not None and _is_user_codec(explicit):  # its encode takes the value
        return FieldSpec(ext=member_ext(field, explicit), encoding=explicit)
    if is_tensor(value):
        value = tensor_to_numpy(key, field, value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.kind == "V":
            raise SchemaError(
                f"sample {key!r}: field {field!r}: arrays of dtype {value.dtype} are not stored "
                "(they would need pickle); convert them to a numeric or string dtype"
            )
        dt = value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype
        return spec("npy", dtype_name(dt), list(value.shape))
    if is_pil(value):
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


def _is_user_codec(encoding: str) -> bool:
    """Whether a user registered a codec for ``encoding`` (see
    :func:`wdsloader.format.register_codec`)."""
    codec = get_codec(encoding)
    return codec is not None and not is_library_codec(codec)


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
        if (
            "encoding" in declared
            and "dtype" not in declared
            and values["encoding"] != base.encoding
        ):
            enc = values["encoding"]
            values["dtype"] = None if _is_user_codec(enc) else _DEFAULT_DTYPES.get(enc, "bytes")
        if not is_fixed_width(values["encoding"]) and "shape" not in declared:
            values["shape"] = None
        spec = FieldSpec(**values)
    else:
        raise TypeError(f"schema[{field!r}] must be a FieldSpec or a dict, got {declared!r}")
    if spec.ext != member_ext(field, spec.encoding):
        raise ValueError(
            f"schema[{field!r}]: ext {spec.ext!r} must be {member_ext(field, spec.encoding)!r}"
        )
    if spec.shape is not None:
        if not is_fixed_width(spec.encoding):
            raise ValueError(
                f"schema[{field!r}]: a shape is only meaningful for fixed-width encodings (npy)"
            )
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


def finish_schema(
    inferred: Mapping[str, FieldSpec],
    values: Mapping[str, tuple[str, Any]],
    declared: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
) -> tuple[dict[str, FieldSpec], dict[str, int]]:
    """``(schema, dims)``: the ``inferred`` specs with the ``declared`` ones (FieldSpec or dict)
    merged over them, unbound symbolic dims bound from ``values`` (a sample's key and value per
    field), and the fields in member order (fixed-size first).

    A declared field that no sample had is a SchemaError, unless it is declared ``optional``
    with an encoding.
    """
    schema = dict(inferred)
    bound = {str(k): int(v) for k, v in (dims or {}).items()}
    for name, decl in (declared or {}).items():
        field, explicit = parse_name(name)
        base = schema.get(field)
        if base is None:
            base = _absent_base(field, decl, sorted(schema))
        spec = _coerce_spec(field, base, decl)
        if explicit is not None and spec.encoding != explicit:
            raise ValueError(f"schema[{name!r}]: encoding {spec.encoding!r} contradicts the name")
        schema[field] = spec
    for field, spec in schema.items():
        if spec.encoding != "npy" or spec.shape is None or field not in values:
            continue
        key, value = values[field]
        actual = np.shape(value.numpy() if is_tensor(value) else value)
        if len(actual) != len(spec.shape):
            raise SchemaError(
                f"sample {key!r}: field {field!r}: shape {fmt_shape(actual)} does not match "
                f"the schema's {fmt_shape(spec.shape)}"
            )
        for dim, size in zip(spec.shape, actual, strict=True):
            if isinstance(dim, str) and dim not in bound:
                bound[dim] = int(size)
    fixed = sorted(f for f, s in schema.items() if s.fixed_size)
    rest = sorted(f for f in schema if f not in fixed)
    return {f: schema[f] for f in fixed + rest}, bound


def _absent_base(field: str, declared: Any, fields: list[str]) -> FieldSpec:
    """The spec of a declared field that no inferred sample had: it must be optional and name
    its encoding."""
    decl = dataclasses.asdict(declared) if isinstance(declared, FieldSpec) else declared
    if not isinstance(decl, Mapping) or not decl.get("optional") or "encoding" not in decl:
        raise SchemaError(
            f"declared field {field!r} is missing from the first samples (they have {fields}); "
            "declare it with optional=True and an encoding if samples may lack it"
        )
    enc = decl["encoding"]
    return FieldSpec(ext=member_ext(field, enc), encoding=enc, dtype=_DEFAULT_DTYPES.get(enc))


def _is_small(spec: FieldSpec, value: Any) -> bool:
    """Whether a field of the first sample is a small scalar (see :mod:`wdsloader.format.groups`)."""
    if spec.encoding == "cls":
        return True
    if spec.encoding == "json":
        return value is None or isinstance(value, (bool, int, float, np.bool_, np.number))
    if spec.encoding == "txt" and spec.dtype == "str" and isinstance(value, str):
        try:
            return len(value.encode("utf-8")) <= SMALL_TEXT_BYTES
        except UnicodeEncodeError:
            return False  # the encoder names the problem
    return False


def with_small_fields_grouped(
    schema: Mapping[str, FieldSpec], sample: Mapping[str, Any]
) -> dict[str, FieldSpec]:
    """``schema`` with the small scalar fields of the first ``sample`` grouped into the member
    ``fields.json`` (``grouped`` set), when at least two qualify; the others unchanged."""
    values = {parse_name(name)[0]: value for name, value in sample.items()}
    small = [f for f, spec in schema.items() if _is_small(spec, values.get(f))]
    if len(small) < MIN_GROUPED:
        return dict(schema)
    if GROUP_FIELD in schema:
        raise ValueError(
            f"group_small_fields: the field {GROUP_FIELD!r} would clash with the grouped member "
            f"{GROUP_EXT!r}; rename that field"
        )
    return {
        f: dataclasses.replace(spec, ext=GROUP_EXT, grouped=True) if f in small else spec
        for f, spec in schema.items()
    }
