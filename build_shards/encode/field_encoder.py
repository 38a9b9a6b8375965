"""A field's checking encoder, picked from the codec registry the loader decodes with
(:mod:`wdsloader.format.codecs`).

For the library's ``npy``, ``cls`` and ``json`` codecs the encoders of
:mod:`build_shards.encode.encoders` write the codec's bytes and check the value against the
schema on the way (dtype, shape, NaN/Inf, ranges, what the loader could not give back); the
other library encodings store bytes (or a PIL image) as they are; a user's codec encodes with its
own ``encode``, its errors named by sample and field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from build_shards.encode.encoders import (
    Encoder,
    bytes_encoder,
    cls_encoder,
    json_encoder,
    npy_encoder,
)
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec
from wdsloader.format.codecs import Codec, get_codec, is_library_codec


class CodecEncoder:
    """A user codec's ``encode`` as a checking encoder: its errors name the sample and field."""

    __slots__ = ("codec", "field", "spec")

    def __init__(self, field: str, spec: FieldSpec, codec: Codec) -> None:
        self.field = field
        self.spec = spec
        self.codec = codec

    def __call__(self, key: str, value: Any) -> tuple[bytes, bool]:
        try:
            data = self.codec.encode(value, self.spec)
        except (TypeError, ValueError) as exc:
            raise SchemaError(
                f"sample {key!r}: field {self.field!r}: codec {self.codec.name!r} cannot encode "
                f"this {type(value).__name__}: {exc}"
            ) from None
        if not isinstance(data, bytes):
            raise SchemaError(
                f"sample {key!r}: field {self.field!r}: codec {self.codec.name!r} returned "
                f"{type(data).__name__}, not bytes"
            )
        return data, False


def _checked_cls(field: str, spec: FieldSpec, dims: Mapping[str, int], allow_nan: bool) -> Encoder:
    return cls_encoder(field, spec)


# the checking encoders of the library codecs that turn values into bytes (the others store bytes)
_CHECKED: dict[str, Callable[[str, FieldSpec, Mapping[str, int], bool], Encoder]] = {
    "npy": npy_encoder,
    "cls": _checked_cls,
    "json": json_encoder,
}


def make_encoder(
    field: str,
    spec: FieldSpec,
    dims: Mapping[str, int],
    allow_nan: bool,
    codec: Codec | None = None,
) -> Encoder:
    """The checking encoder of one field (``codec``: the one resolved for its encoding, default
    the registry's)."""
    if codec is None:
        codec = get_codec(spec.encoding)
    if codec is not None and not is_library_codec(codec):
        return CodecEncoder(field, spec, codec)
    checked = _CHECKED.get(spec.encoding)
    if checked is not None:
        return checked(field, spec, dims, allow_nan)
    return bytes_encoder(field, spec, known=codec is not None)
