"""The decoder registry, and :class:`SampleDecoder`, which decodes the fields a caller asks for.

Decoders are keyed by *encoding* (the last part of a member extension: ``question_emb.npy`` ->
``npy``); the default table (:data:`wdsloader.decode.codecs.DEFAULT_DECODERS`, the library
codecs' decoders) is safe: ``.npy`` is parsed without pickle, ``torch.load`` runs with
``weights_only=True`` and pickle members are refused unless the caller opts in. A codec
registered with :func:`wdsloader.format.register_codec` decodes its encodings (over the
library's decoder); :func:`register_decoder` overrides the decoding of an encoding, over both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wdsloader.decode.checks import (
    ClsCast,
    NoneOr,
    SchemaMismatch,
    Then,
    cls_cast,
    npy_check,
)
from wdsloader.decode.codecs import (
    DEFAULT_DECODERS,
    TRUSTED_DECODERS,
    Decoder,
    decode_bytes,
    decode_uint8,
)
from wdsloader.decode.groups import GroupedValue
from wdsloader.decode.images import is_image_decoder
from wdsloader.errors import DecodeError, PickleNotAllowedError
from wdsloader.format.codecs import CodecDecoder, decoder_of, user_codecs
from wdsloader.format.keys import field_of_ext
from wdsloader.format.manifest import FieldSpec

_REGISTRY: dict[str, Decoder] = dict(DEFAULT_DECODERS)
"""The library's decoders and those :func:`register_decoder` set, by encoding."""


def _decoder_table() -> dict[str, Decoder]:
    """``{encoding: decoder}``: the user's codecs over the library's decoders, and the
    decoders :func:`register_decoder` set over both."""
    table = dict(_REGISTRY)
    for enc, codec in user_codecs().items():
        if table.get(enc) is DEFAULT_DECODERS.get(enc):  # not overridden by register_decoder
            table[enc] = decoder_of(codec)
    return table


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
    table = _decoder_table()
    if enc in table and not replace:
        name = getattr(table[enc], "__name__", repr(table[enc]))
        raise ValueError(
            f"a decoder for encoding {enc!r} is already registered ({name}); "
            "pass replace=True to override it"
        )
    _REGISTRY[enc] = fn


def get_decoder(encoding: str) -> Decoder:
    """The decoder registered for ``encoding``; :func:`decode_bytes` for unknown encodings."""
    return _decoder_table().get(encoding.lower(), decode_bytes)


__all__ = ["ClsCast", "NoneOr", "SampleDecoder", "Then", "get_decoder", "register_decoder"]

RAW_BYTES = ("uint8", "bytes")
IMAGES = ("decoded", "encoded")


def check_raw_bytes(value: str) -> str:
    """``value`` when it is one of :data:`RAW_BYTES` (how raw-bytes fields without a declared
    dtype are decoded), else a ValueError naming the choices."""
    if value not in RAW_BYTES:
        raise ValueError(f"raw_bytes must be one of {RAW_BYTES}, got {value!r}")
    return value


def check_images(value: str) -> str:
    """``value`` when it is one of :data:`IMAGES` (whether image members are decoded or kept
    encoded), else a ValueError naming the choices."""
    if value not in IMAGES:
        raise ValueError(f"images must be one of {IMAGES}, got {value!r}")
    return value


_Step = tuple[str, str, Decoder, Callable[[Any], Any] | None]  # field, ext, decoder, post


class SampleDecoder:
    """Decode the requested fields of one sample's raw members into a dict keyed by field.

    With a ``schema`` (field name -> :class:`FieldSpec`, as in the manifest) a field is read from
    the member ``spec.ext`` and decoded by its ``spec.encoding``; ``cls`` values are cast to the
    declared numpy dtype and ``npy`` arrays are checked against the declared dtype and shape
    (its ints and the symbolic dims bound in ``dims``, the manifest's ``dims``; a field whose
    dims are all unbound is not checked). A raw-bytes field (``bin`` and the other encodings
    without a decoder of their own) declared ``dtype: "uint8"`` is decoded to a 1-D uint8
    array instead of ``bytes`` (:func:`~wdsloader.decode.codecs.decode_uint8`). Without a schema the field of a member ``ext`` is
    ``field_of_ext(ext)[0]`` (``jpg`` -> ``jpg``, ``seg.png`` -> ``seg``).

    ``fields`` limits decoding to those fields (default: all). ``decoders`` overrides decoders
    per encoding for this instance. ``allow_pickle=True`` (only for trusted data) unpickles
    ``pkl``/``pickle``/``pyd`` members and object arrays in ``npy``/``npz``, and loads ``pt``
    with ``weights_only=False``. ``raw_bytes="uint8"`` decodes every raw-bytes field as if
    declared ``uint8`` (the loader's default); ``"bytes"`` (this class's default) keeps the
    undeclared ones ``bytes``. ``images="encoded"`` keeps the members the library's image
    decoder would decode as raw bytes (1-D uint8 arrays of the encoded file), for a decoder on
    the device (:class:`~wdsloader.stream.DevicePrefetcher`). The output also holds
    ``"__key__"``. A field the schema marks ``optional`` is None in a sample that lacks its
    member.
    """

    def __init__(
        self,
        schema: Mapping[str, FieldSpec] | None = None,
        fields: Sequence[str] | None = None,
        *,
        allow_pickle: bool = False,
        decoders: Mapping[str, Decoder] | None = None,
        dims: Mapping[str, int] | None = None,
        raw_bytes: str = "bytes",
        images: str = "decoded",
    ) -> None:
        if isinstance(fields, str):
            raise TypeError(f"fields must be a sequence of field names, not the string {fields!r}")
        self.schema = dict(schema) if schema is not None else None
        self.fields = None if fields is None else tuple(dict.fromkeys(fields))
        self.allow_pickle = allow_pickle
        self.raw_bytes = check_raw_bytes(raw_bytes)
        self.images = check_images(images)
        self.dims = dict(dims or {})
        table = _decoder_table()
        if allow_pickle:
            table.update(TRUSTED_DECODERS)
        for enc, fn in (decoders or {}).items():
            if not callable(fn):
                raise TypeError(f"decoder for {enc!r} must be callable, got {fn!r}")
            table[enc.lower()] = fn
        self._table = table
        self._plan: list[_Step] | None = None
        self._steps: dict[str, _Step] = {}
        self._plans_by_exts: dict[tuple[str, ...], list[_Step]] = {}
        self._optional = frozenset(f for f, s in (self.schema or {}).items() if s.optional)
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

    def decodes_any(self, test: Callable[[Decoder], bool]) -> bool:
        """Whether the requested fields include one whose decoder passes ``test`` (known only
        with a schema)."""
        return self._plan is not None and any(test(step[2]) for step in self._plan)

    @property
    def member_exts(self) -> tuple[str, ...] | None:
        """The member extensions this decoder reads, when a schema fixes them (else None)."""
        return None if self._plan is None else tuple(step[1] for step in self._plan)

    def decoder_for(self, encoding: str) -> Decoder:
        """The decoder this instance uses for ``encoding``."""
        fn = self._table.get(encoding.lower(), decode_bytes)
        if self.images == "encoded" and is_image_decoder(fn):
            return decode_uint8  # the encoded file, for a decoder on the device
        return decode_uint8 if fn is decode_bytes and self.raw_bytes == "uint8" else fn

    def _schema_step(self, field: str) -> _Step:
        """How to decode schema field ``field`` (built once per field)."""
        step = self._steps.get(field)
        if step is not None:
            return step
        spec = self.schema[field]  # type: ignore[index]
        encoding = (spec.encoding or field_of_ext(spec.ext)[1]).lower()
        post: Callable[[Any], Any] | None = None
        fn = self.decoder_for(encoding)
        if isinstance(fn, CodecDecoder) and fn.spec is None:
            fn = CodecDecoder(fn.codec, spec)  # a user codec: decode with the field's spec
        if spec.grouped:  # a value in the sample's JSON object of small fields
            fn = GroupedValue(field, encoding, fn, bool(spec.optional))
        elif fn is decode_bytes and spec.dtype == "uint8":
            fn = decode_uint8  # raw bytes declared as a uint8 vector
        if encoding == "npy":
            post = npy_check(spec, self.dims)
        elif encoding == "cls":
            post = cls_cast(spec)
        if post is not None and spec.optional:
            post = NoneOr(post)  # an optional grouped field without an entry reads as None
        step = self._steps[field] = (field, spec.ext.lower(), fn, post)
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
        optional = self._optional
        try:
            for field, ext, fn, post in plan:
                if optional and ext not in raw and field in optional:
                    out[field] = None  # an optional field this sample lacks
                    continue
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
        return ext, Then(fn, post)

    def decode_field(self, raw: Mapping[str, Any], key: str, source: str, field: str) -> Any:
        """Decode one field of a sample (for callers that pick fields per sample)."""
        if self.schema is not None:
            if field not in self.schema:
                raise ValueError(f"unknown field {field!r}; the schema has: {sorted(self.schema)}")
            _, ext, fn, post = self._schema_step(field)
            if field in self._optional and ext not in raw:
                return None  # an optional field this sample lacks
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
        return self.decoder_for("npy") in (DEFAULT_DECODERS["npy"], TRUSTED_DECODERS["npy"])

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
        if isinstance(exc, SchemaMismatch):
            return DecodeError(f"{where} does not match the schema: {exc}")
        if isinstance(exc, PickleNotAllowedError):
            return PickleNotAllowedError(f"{where}: {exc}")
        if isinstance(exc, DecodeError):
            return DecodeError(f"{where}: {exc}")
        return DecodeError(f"{where}: cannot decode: {type(exc).__name__}: {exc}")
