"""Splitting a sample's bytes into members, and decoding members into Python/numpy values.

:func:`parse_sample` turns the byte range of one sample (as the ``.tar.idx`` gives it) into
``(key, {ext: memoryview})``. Decoders live in a registry keyed by *encoding* (the last part of a
member extension: ``question_emb.npy`` -> ``npy``); the default table is safe: ``.npy`` is parsed
without pickle, ``torch.load`` runs with ``weights_only=True`` and pickle members are refused
unless the caller opts in. :class:`SampleDecoder` decodes only the fields a caller asks for.

Pillow and torch are imported only when an image or a ``.pt`` member is decoded.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wdsloader.errors import DecodeError, PickleNotAllowedError, ShardFormatError
from wdsloader.format.keys import field_of_ext, split_name
from wdsloader.format.manifest import FieldSpec
from wdsloader.format.npy import read_npy_header
from wdsloader.format.ustar import BLOCK, iter_members, plain_member

Buffer = bytes | bytearray | memoryview
Decoder = Callable[[Any], Any]


class _NotPlain(Exception):
    """A header the fast path does not handle (PAX, GNU, prefix, links, end marker...)."""


def parse_sample(
    buf: Buffer,
    start: int = 0,
    end: int | None = None,
    *,
    base_offset: int = 0,
    source: str = "<shard>",
) -> tuple[str, dict[str, memoryview]]:
    """The members of the one sample lying in ``buf[start:end]``: ``(key, {ext: data})``.

    Extensions are lower-cased (the WebDataset rule of :func:`wdsloader.format.split_name`);
    members webdataset skips (no dot, ``__meta__``-style names) are skipped. The data are
    memoryviews into ``buf`` (no copy). Byte offsets in errors are ``base_offset`` plus the
    position in ``buf``. Raises :class:`ShardFormatError` naming ``source``, the byte offset and
    the key when the range holds no member, members of two keys, an extension twice, a corrupt
    header or data running past the range.

    Plain ustar headers (what our writer and most tools write for short ASCII names) take a fast
    path; anything else (PAX or GNU extension headers, a ``prefix`` field, links, a bad checksum)
    is re-parsed with :func:`wdsloader.format.iter_members`, which also produces the errors.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    stop = len(view) if end is None else end
    if stop > len(view):
        raise ShardFormatError(
            f"{source} at byte {base_offset + start}: sample range ends at byte "
            f"{base_offset + stop} but only {len(view)} bytes were read (truncated shard?)"
        )
    try:
        return _parse_plain(buf, view, start, stop, base_offset, source)
    except _NotPlain:
        return _parse_general(view, start, stop, base_offset, source)


def _parse_plain(
    buf: Buffer, view: memoryview, start: int, stop: int, base_offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    """Fast path over plain ustar headers; raises :class:`_NotPlain` on anything else."""
    key: str | None = None
    out: dict[str, memoryview] = {}
    src = buf if isinstance(buf, bytes) else None
    pos = start
    while pos + BLOCK <= stop:
        hdr = src[pos : pos + BLOCK] if src is not None else bytes(view[pos : pos + BLOCK])
        plain = plain_member(hdr)
        if plain is None:
            raise _NotPlain
        name, size = plain
        data_pos = pos + BLOCK
        if data_pos + size > stop:
            raise _NotPlain  # the general path words the error
        parts = split_name(name)
        if parts is not None:
            mkey, ext = parts
            if key is None:
                key = mkey
            if mkey != key or ext in out:
                _member_error(key, mkey, ext, name, base_offset + pos, source)
            out[ext] = view[data_pos : data_pos + size]
        pos = data_pos + (size + BLOCK - 1) // BLOCK * BLOCK
    if pos < stop:
        raise _NotPlain
    return _finish(key, out, base_offset + start, source)


def _parse_general(
    view: memoryview, start: int, stop: int, base_offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    """Any tar flavour, through :func:`iter_members`."""
    key: str | None = None
    out: dict[str, memoryview] = {}
    for member in iter_members(view, start, stop, base_offset=base_offset, source=source):
        data_pos = member.data_offset - base_offset
        if data_pos + member.size > stop:
            raise ShardFormatError(
                f"{source} at byte {member.header_offset}: data of member {member.name!r} "
                f"({member.size} bytes) runs past the end of the sample range at byte "
                f"{base_offset + stop} (stale or wrong .tar.idx?)"
            )
        parts = split_name(member.name)
        if parts is not None:
            mkey, ext = parts
            if key is None:
                key = mkey
            if mkey != key or ext in out:
                _member_error(key, mkey, ext, member.name, member.header_offset, source)
            out[ext] = view[data_pos : data_pos + member.size]
    return _finish(key, out, base_offset + start, source)


def _member_error(key: str, mkey: str, ext: str, name: str, offset: int, source: str) -> None:
    """Raise the error for a member of another key, or a repeated extension."""
    if mkey != key:
        raise ShardFormatError(
            f"{source} at byte {offset}: member {name!r} belongs to sample {mkey!r}, but this "
            f"range holds sample {key!r} (stale or wrong .tar.idx?)"
        )
    raise ShardFormatError(
        f"{source} at byte {offset}: sample {key!r} has the extension {ext!r} twice"
    )


def _finish(
    key: str | None, out: dict[str, memoryview], offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    if key is None:
        raise ShardFormatError(
            f"{source} at byte {offset}: no sample member (KEY.EXT) in this range "
            "(stale or wrong .tar.idx?)"
        )
    return key, out


_PICKLE_HINT = "pass allow_pickle=True if you trust the data"


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
            + _PICKLE_HINT
        )
    count = math.prod(shape)
    need = count * dtype.itemsize
    if len(view) - offset < need:
        raise ValueError(
            f".npy data truncated: {len(view) - offset} bytes for shape {shape} of {dtype} "
            f"({need} bytes)"
        )
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    if fortran:
        return flat.reshape(shape[::-1]).T.copy(order="F")
    return flat.reshape(shape).copy()


def _decode_npy_trusted(buf: Buffer) -> np.ndarray:
    """:func:`decode_npy`, falling back to ``np.load(allow_pickle=True)`` for object arrays."""
    try:
        return decode_npy(buf)
    except PickleNotAllowedError:
        return np.load(io.BytesIO(bytes(buf)), allow_pickle=True)


def _load_npz(buf: Buffer, allow_pickle: bool) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(bytes(buf)), allow_pickle=allow_pickle) as npz:
            return {name: npz[name] for name in npz.files}
    except ValueError as exc:
        if not allow_pickle and "allow_pickle" in str(exc):
            raise PickleNotAllowedError(
                f"the .npz holds object arrays, which need pickle to load; {_PICKLE_HINT}"
            ) from None
        raise


def decode_npz(buf: Buffer) -> dict[str, np.ndarray]:
    """A ``.npz`` member as ``{name: array}`` (``allow_pickle=False``)."""
    return _load_npz(buf, allow_pickle=False)


def _decode_npz_trusted(buf: Buffer) -> dict[str, np.ndarray]:
    return _load_npz(buf, allow_pickle=True)


_SCAN_JSON = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _msgspec_json() -> tuple[Callable[[Any], Any] | None, tuple[type[Exception], ...]]:
    """msgspec's JSON decoder and its error type, when msgspec is installed (optional: 3x the
    stdlib's C scanner on small objects; bench/json_parsers.py)."""
    try:
        import msgspec
    except ImportError:
        return None, ()
    return msgspec.json.Decoder().decode, (msgspec.MsgspecError,)


_FAST_JSON, _FAST_JSON_ERRORS = _msgspec_json()


def decode_json(buf: Buffer) -> Any:
    """A JSON member, exactly as ``json.loads`` reads it (UTF-8, a BOM or UTF-16/32 included).

    With msgspec installed, msgspec decodes it (the same values and types: exact big ints,
    correctly rounded floats, the last of duplicate keys); anything msgspec refuses (NaN and
    Infinity, numbers beyond float range, lone surrogates, a BOM, UTF-16/32, invalid JSON)
    goes the stdlib way, which also words the errors. Without msgspec, a UTF-8 document without
    surrounding whitespace goes straight to the C scanner, skipping ``json.loads``' Python
    layers.
    """
    if _FAST_JSON is not None:
        try:
            return _FAST_JSON(buf)
        except _FAST_JSON_ERRORS:
            pass
    try:
        text = str(buf, "utf-8")
        value, end = _SCAN_JSON(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(bytes(buf))
    if end != len(text):
        return json.loads(bytes(buf))
    return value


def decode_text(buf: Buffer) -> str:
    """A UTF-8 text member as ``str``."""
    return str(buf, "utf-8")


def decode_int(buf: Buffer) -> int:
    """A class label / index member (ASCII digits, surrounding whitespace allowed) as ``int``."""
    return int(bytes(buf))


def decode_bytes(buf: Buffer) -> bytes:
    """Any other member: its raw bytes (a copy, so the shard buffer is not kept alive)."""
    return bytes(buf)


def decode_pt(buf: Buffer) -> Any:
    """A ``torch.save`` member via ``torch.load(weights_only=True)`` onto the CPU."""
    import torch

    return torch.load(io.BytesIO(bytes(buf)), map_location="cpu", weights_only=True)


def _decode_pt_trusted(buf: Buffer) -> Any:
    import torch

    return torch.load(io.BytesIO(bytes(buf)), map_location="cpu", weights_only=False)


def decode_pickle_refused(buf: Buffer) -> Any:
    """Refuse a pickle member: unpickling untrusted data can run arbitrary code."""
    raise PickleNotAllowedError(
        "pickle members can run arbitrary code when loaded and are refused by default; "
        + _PICKLE_HINT
    )


def _decode_pickle_trusted(buf: Buffer) -> Any:
    import pickle

    return pickle.loads(bytes(buf))  # noqa: S301 - explicit opt-in via allow_pickle=True


def decode_image(buf: Buffer) -> np.ndarray:
    """An image member via Pillow as a ``uint8`` array of shape ``(H, W, C)``.

    Grey-scale and bi-level images give ``C == 1``; images with an alpha channel (or a palette
    with transparency) give RGBA, ``C == 4``; every other mode is converted to RGB, ``C == 3``.
    Animated images give their first frame.
    """
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "decoding images needs Pillow: pip install pillow (or wdsloader[image])"
        ) from None
    with Image.open(io.BytesIO(bytes(buf))) as img:
        mode = img.mode
        if mode in ("L", "RGB", "RGBA"):
            target = mode
        elif mode == "1" or mode.startswith("I") or mode == "F":
            target = "L"
        elif mode in ("LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in img.info):
            target = "RGBA"
        else:
            target = "RGB"
        arr = np.array(img if target == mode else img.convert(target), dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


IMAGE_ENCODINGS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
PICKLE_ENCODINGS = ("pkl", "pickle", "pyd")

_DEFAULTS: dict[str, Decoder] = {
    "npy": decode_npy,
    "npz": decode_npz,
    "json": decode_json,
    "jsn": decode_json,
    "txt": decode_text,
    "text": decode_text,
    "cls": decode_int,
    "cls2": decode_int,
    "index": decode_int,
    "id": decode_int,
    "pt": decode_pt,
    "pth": decode_pt,
    **{enc: decode_image for enc in IMAGE_ENCODINGS},
    **{enc: decode_pickle_refused for enc in PICKLE_ENCODINGS},
}
_REGISTRY: dict[str, Decoder] = dict(_DEFAULTS)

# What ``allow_pickle=True`` swaps in: the caller said the data are trusted.
_TRUSTED: dict[str, Decoder] = {
    "npy": _decode_npy_trusted,
    "npz": _decode_npz_trusted,
    "pt": _decode_pt_trusted,
    "pth": _decode_pt_trusted,
    **{enc: _decode_pickle_trusted for enc in PICKLE_ENCODINGS},
}


def register_decoder(encoding: str, fn: Decoder, *, replace: bool = False) -> None:
    """Register ``fn`` (``memoryview | bytes -> value``) for members of ``encoding``.

    ``encoding`` is the last part of a member extension (``npy`` for ``emb.npy``), matched
    case-insensitively. Registering an encoding that already has a decoder (a default one
    included) is a ValueError unless ``replace=True``. Decoders already resolved by an existing
    :class:`SampleDecoder` are not affected.
    """
    if not isinstance(encoding, str) or not encoding or "." in encoding:
        raise ValueError(f"encoding must be a non-empty string without '.', got {encoding!r}")
    if not callable(fn):
        raise TypeError(f"decoder for {encoding!r} must be callable, got {fn!r}")
    enc = encoding.lower()
    if enc in _REGISTRY and not replace:
        raise ValueError(
            f"a decoder for encoding {enc!r} is already registered ({_REGISTRY[enc].__name__}); "
            "pass replace=True to override it"
        )
    _REGISTRY[enc] = fn


def get_decoder(encoding: str) -> Decoder:
    """The decoder registered for ``encoding``; :func:`decode_bytes` for unknown encodings."""
    return _REGISTRY.get(encoding.lower(), decode_bytes)


class _SchemaMismatch(ValueError):
    """A decoded value does not match its FieldSpec."""


class _NpyCheck:
    """Post-decode check of an ``npy`` field against the schema's dtype and all-int shape.

    A small class rather than a closure: the decoder travels to ``spawn``/``forkserver``
    workers by pickle.
    """

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.shape = shape

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            raise _SchemaMismatch(f"expected an array, got {type(value).__name__}")
        if value.dtype != self.dtype:
            raise _SchemaMismatch(f"dtype {value.dtype}, schema says {self.dtype}")
        if value.shape != self.shape:
            raise _SchemaMismatch(f"shape {list(value.shape)}, schema says {list(self.shape)}")
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NpyCheck) and (self.dtype, self.shape) == (
            other.dtype,
            other.shape,
        )

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape))

    def __repr__(self) -> str:
        return f"_NpyCheck({self.dtype}, {list(self.shape)})"


def _npy_check(spec: FieldSpec) -> _NpyCheck | None:
    """A post-decode check of dtype and shape for an ``npy`` field with an all-int shape."""
    if spec.dtype is None or spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
        return None
    return _NpyCheck(np.dtype(spec.dtype), tuple(int(d) for d in spec.shape))


class _ClsCast:
    """Cast a ``cls`` int to a numpy scalar type (a class, so it pickles; see :class:`_NpyCheck`)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def __call__(self, value: Any) -> Any:
        try:
            return self.dtype.type(value)
        except (OverflowError, ValueError) as exc:
            raise _SchemaMismatch(
                f"value {value!r} does not fit dtype {self.dtype}: {exc}"
            ) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ClsCast) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __repr__(self) -> str:
        return f"_ClsCast({self.dtype})"


def _cls_cast(spec: FieldSpec) -> _ClsCast | None:
    """Cast a ``cls`` int to the numpy scalar type the schema declares (``int64`` ...)."""
    if spec.dtype is None:
        return None
    try:
        dtype = np.dtype(spec.dtype)
    except TypeError:
        return None
    if dtype.kind not in "biuf":
        return None  # a non-numeric dtype name: keep the Python int
    return _ClsCast(dtype)


class _Then:
    """``post(fn(buf))``: a decoder followed by its schema check (picklable)."""

    __slots__ = ("fn", "post")

    def __init__(self, fn: Decoder, post: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.post = post

    def __call__(self, buf: Any) -> Any:
        return self.post(self.fn(buf))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Then) and (self.fn, self.post) == (other.fn, other.post)

    def __hash__(self) -> int:
        return hash((self.fn, self.post))

    def __repr__(self) -> str:
        return f"_Then({self.fn!r}, {self.post!r})"


_Step = tuple[str, str, Decoder, Callable[[Any], Any] | None]  # field, ext, decoder, post


class SampleDecoder:
    """Decode the requested fields of one sample's raw members into a dict keyed by field.

    With a ``schema`` (field name -> :class:`FieldSpec`, as in the manifest) a field is read from
    the member ``spec.ext`` and decoded by its ``spec.encoding``; ``cls`` values are cast to the
    declared numpy dtype and ``npy`` arrays whose declared shape has only ints are checked
    against the declared dtype and shape. Without a schema the field of a member ``ext`` is
    ``field_of_ext(ext)[0]`` (``jpg`` -> ``jpg``, ``seg.png`` -> ``seg``).

    ``fields`` limits decoding to those fields (default: all). ``decoders`` overrides decoders
    per encoding for this instance. ``allow_pickle=True`` (only for trusted data) unpickles
    ``pkl``/``pickle``/``pyd`` members and object arrays in ``npy``/``npz``, and loads ``pt``
    with ``weights_only=False``. The output also holds ``"__key__"``.
    """

    def __init__(
        self,
        schema: Mapping[str, FieldSpec] | None = None,
        fields: Sequence[str] | None = None,
        *,
        allow_pickle: bool = False,
        decoders: Mapping[str, Decoder] | None = None,
    ) -> None:
        if isinstance(fields, str):
            raise TypeError(f"fields must be a sequence of field names, not the string {fields!r}")
        self.schema = dict(schema) if schema is not None else None
        self.fields = None if fields is None else tuple(dict.fromkeys(fields))
        self.allow_pickle = allow_pickle
        table = dict(_REGISTRY)
        if allow_pickle:
            table.update(_TRUSTED)
        for enc, fn in (decoders or {}).items():
            if not callable(fn):
                raise TypeError(f"decoder for {enc!r} must be callable, got {fn!r}")
            table[enc.lower()] = fn
        self._table = table
        self._plan: list[_Step] | None = None
        self._steps: dict[str, _Step] = {}
        self._plans_by_exts: dict[tuple[str, ...], list[_Step]] = {}
        if self.schema is not None:
            wanted = self.fields if self.fields is not None else tuple(self.schema)
            unknown = [f for f in wanted if f not in self.schema]
            if unknown:
                raise ValueError(
                    f"unknown field(s) {unknown}; the schema has: {sorted(self.schema)}"
                )
            self._plan = [self._schema_step(f) for f in wanted]

    def decodes(self, fn: Decoder) -> bool:
        """Whether the requested fields include one that decoder ``fn`` decodes (known only
        with a schema)."""
        return self._plan is not None and any(step[2] is fn for step in self._plan)

    @property
    def member_exts(self) -> tuple[str, ...] | None:
        """The member extensions this decoder reads, when a schema fixes them (else None)."""
        return None if self._plan is None else tuple(step[1] for step in self._plan)

    def decoder_for(self, encoding: str) -> Decoder:
        """The decoder this instance uses for ``encoding``."""
        return self._table.get(encoding.lower(), decode_bytes)

    def _schema_step(self, field: str) -> _Step:
        """How to decode schema field ``field`` (built once per field)."""
        step = self._steps.get(field)
        if step is not None:
            return step
        spec = self.schema[field]  # type: ignore[index]
        encoding = (spec.encoding or field_of_ext(spec.ext)[1]).lower()
        post: Callable[[Any], Any] | None = None
        if encoding == "npy":
            post = _npy_check(spec)
        elif encoding == "cls":
            post = _cls_cast(spec)
        step = self._steps[field] = (field, spec.ext.lower(), self.decoder_for(encoding), post)
        return step

    def _plan_for(self, exts: tuple[str, ...], key: str, source: str) -> list[_Step]:
        """Schema-less plan for a sample with these member extensions (cached per ext set)."""
        plan = self._plans_by_exts.get(exts)
        if plan is not None:
            return plan
        by_field: dict[str, str] = {}
        for ext in exts:
            field = field_of_ext(ext)[0]
            if field in by_field and (self.fields is None or field in self.fields):
                raise DecodeError(
                    f"{source}: sample {key!r} has two members for field {field!r} "
                    f"({by_field[field]!r} and {ext!r}); pass a schema to pick one"
                )
            by_field[field] = ext
        wanted = self.fields if self.fields is not None else tuple(by_field)
        plan = []
        for field in wanted:
            member = by_field.get(field)
            if member is None:
                raise DecodeError(
                    f"{source}: sample {key!r} has no field {field!r}; "
                    f"its fields: {sorted(by_field)}"
                )
            plan.append((field, member, self.decoder_for(field_of_ext(member)[1]), None))
        if len(self._plans_by_exts) < 64:
            self._plans_by_exts[exts] = plan
        return plan

    def __call__(self, raw: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
        """Decode the requested fields of the sample ``key`` of shard ``source``.

        ``raw`` maps member extensions to their bytes (as :func:`parse_sample` returns them).
        Raises :class:`DecodeError` (or :class:`PickleNotAllowedError`) naming the shard, key
        and field.
        """
        plan = self._plan if self._plan is not None else self._plan_for(tuple(raw), key, source)
        out: dict[str, Any] = {"__key__": key}
        field = ext = ""
        try:
            for field, ext, fn, post in plan:
                value = fn(raw[ext])
                out[field] = value if post is None else post(value)
        except Exception as exc:
            raise self._error(exc, raw, key, source, field, ext) from exc
        return out

    def field_decoder(self, field: str) -> tuple[str, Callable[[Any], Any]]:
        """``(member extension, decode function)`` of schema field ``field``, the function
        including the schema checks (errors are not put in context: see :meth:`decode_field`)."""
        if self.schema is None or field not in self.schema:
            raise ValueError(
                f"unknown field {field!r}; the schema has: {sorted(self.schema or {})}"
            )
        _, ext, fn, post = self._schema_step(field)
        if post is None:
            return ext, fn
        return ext, _Then(fn, post)

    def decode_field(self, raw: Mapping[str, Any], key: str, source: str, field: str) -> Any:
        """Decode one field of a sample (for callers that pick fields per sample)."""
        if self.schema is not None:
            if field not in self.schema:
                raise ValueError(f"unknown field {field!r}; the schema has: {sorted(self.schema)}")
            _, ext, fn, post = self._schema_step(field)
        else:
            exts = [e for e in raw if field_of_ext(e)[0] == field]
            if len(exts) != 1:
                raise DecodeError(
                    f"{source}: sample {key!r} has {len(exts)} members for field {field!r}; "
                    f"its members: {sorted(raw)}"
                )
            ext, post = exts[0], None
            fn = self.decoder_for(field_of_ext(ext)[1])
        try:
            value = fn(raw[ext])
            return value if post is None else post(value)
        except Exception as exc:
            raise self._error(exc, raw, key, source, field, ext) from exc

    def field_error(
        self, exc: Exception, key: str, source: str, field: str, ext: str
    ) -> DecodeError:
        """The error :meth:`decode_field` raises when decoding member ``ext`` of ``field`` of
        sample ``key`` raised ``exc`` (for callers that run :meth:`field_decoder` themselves)."""
        return self._error(exc, {ext: None}, key, source, field, ext)

    @property
    def npy_is_builtin(self) -> bool:
        """Whether ``npy`` members are decoded by the built-in decoder (so an array read
        straight from the shard's bytes is what this decoder returns)."""
        return self.decoder_for("npy") in (decode_npy, _decode_npy_trusted)

    @staticmethod
    def _error(
        exc: Exception, raw: Mapping[str, Any], key: str, source: str, field: str, ext: str
    ) -> DecodeError:
        """The contextual error for a failure while decoding ``field`` of sample ``key``."""
        if isinstance(exc, KeyError) and ext not in raw:
            return DecodeError(
                f"{source}: sample {key!r} has no member {ext!r} (field {field!r}); "
                f"its members: {sorted(raw)}"
            )
        where = f"{source}: sample {key!r}, field {field!r} (member {key}.{ext})"
        if isinstance(exc, _SchemaMismatch):
            return DecodeError(f"{where} does not match the schema: {exc}")
        if isinstance(exc, PickleNotAllowedError):
            return PickleNotAllowedError(f"{where}: {exc}")
        if isinstance(exc, DecodeError):
            return DecodeError(f"{where}: {exc}")
        return DecodeError(f"{where}: cannot decode: {type(exc).__name__}: {exc}")
