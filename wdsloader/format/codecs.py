"""The codec registry: one :class:`Codec` per encoding pairs the bytes ``build_shards`` writes for
a field with the value the loader reads back, so a new encoding has one place.

An encoding is the last part of a member extension (``npy`` for ``question_emb.npy``). The
library registers its codecs: the pure ones (``npy``, ``json``, ``txt``, ``cls`` and their
aliases) in :mod:`wdsloader.format.builtin_codecs` (imported with this package), those whose
decoding needs Pillow or torch (images, ``npz``, ``pt``, pickle) in
:mod:`wdsloader.decode.codecs`, imported on the first lookup through the package root's seam. A user codec registered once with
:func:`register_codec` is used by ``build_shards`` for a field of its encoding and by the loader
to decode it. An encoding without a codec is stored and read back as raw bytes (the WebDataset
convention: ``.bin``, ``.flac`` ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from wdsloader import seams
from wdsloader.errors import SchemaError

if TYPE_CHECKING:
    from wdsloader.format.manifest import FieldSpec

Buffer = bytes | bytearray | memoryview
CODECS_SEAM = "codecs"  # the package root names the module that registers the other codecs
_ENCODING_RE = re.compile(r"^[a-z0-9]+$")


@runtime_checkable
class Codec(Protocol):
    """A byte format: how a value of a field becomes a member's bytes and back.

    ``name`` names the codec; ``encodings`` are the member extensions' last parts it owns (its
    name first, then aliases such as ``jsn`` for ``json``). ``fixed_width``: a value of a field
    with a declared dtype and shape always encodes to the same number of bytes, so such fields
    come first in every sample, at a constant offset the manifest records (only ``npy`` among
    the library's codecs). ``encode`` returns the member's bytes (raise ValueError or TypeError
    for a value it cannot store; the builder names the sample and field); ``decode`` gets the
    member's bytes (often a memoryview into the shard) and the field's spec (None when the
    dataset has no schema). A codec travels to worker processes by pickle: define it at module
    level.
    """

    name: str
    encodings: tuple[str, ...]
    fixed_width: bool

    def encode(self, value: Any, spec: FieldSpec) -> bytes: ...

    def decode(self, data: Buffer, spec: FieldSpec | None) -> Any: ...


class UnknownEncodingError(SchemaError, LookupError):
    """A field's encoding has no codec where one is needed."""


class FunctionCodec:
    """A codec made of a decode function ``decoder(data)`` and an optional ``encoder(value)``
    (default: bytes stored as they are); the form of the library's codecs."""

    __slots__ = ("decoder", "encoder", "encodings", "fixed_width", "name")

    def __init__(
        self,
        name: str,
        decoder: Callable[[Any], Any],
        *,
        encodings: tuple[str, ...] = (),
        encoder: Callable[[Any], bytes] | None = None,
        fixed_width: bool = False,
    ) -> None:
        self.name = name
        self.encodings = encodings or (name,)
        self.decoder = decoder
        self.encoder = encoder
        self.fixed_width = fixed_width

    def encode(self, value: Any, spec: FieldSpec) -> bytes:
        if self.encoder is not None:
            return self.encoder(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"expected bytes (.{self.name}), got {type(value).__name__}")

    def decode(self, data: Buffer, spec: FieldSpec | None) -> Any:
        return self.decoder(data)

    def __repr__(self) -> str:
        return f"FunctionCodec({self.name!r}, {self.decoder.__name__})"


class CodecDecoder:
    """``codec.decode(data, spec)`` as the one-argument decode function the loader calls
    (a class, so it pickles to worker processes)."""

    __slots__ = ("codec", "spec")

    def __init__(self, codec: Codec, spec: FieldSpec | None = None) -> None:
        self.codec = codec
        self.spec = spec

    def __call__(self, data: Any) -> Any:
        return self.codec.decode(data, self.spec)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CodecDecoder)
            and self.codec is other.codec
            and self.spec == other.spec
        )

    def __hash__(self) -> int:
        return hash((id(self.codec), repr(self.spec)))

    def __repr__(self) -> str:
        return f"CodecDecoder({self.codec.name!r})"


def decoder_of(codec: Codec, spec: FieldSpec | None = None) -> Callable[[Any], Any]:
    """The one-argument decode function of ``codec`` for a field of ``spec``."""
    if isinstance(codec, FunctionCodec):
        return codec.decoder
    return CodecDecoder(codec, spec)


_CODECS: dict[str, Codec] = {}  # encoding -> codec
_LIBRARY: dict[str, Codec] = {}  # encoding -> the library's codec (what unregister restores)
_loaded = False


def _check(codec: object) -> Codec:
    if not isinstance(codec, Codec):
        raise TypeError(
            f"a codec needs name, encodings, fixed_width, encode(value, spec) and "
            f"decode(data, spec); got {codec!r}"
        )
    encodings = codec.encodings
    if isinstance(encodings, str) or not isinstance(encodings, tuple) or not encodings:
        raise ValueError(f"codec {codec.name!r}: encodings must be a non-empty tuple of str")
    for enc in encodings:
        if not isinstance(enc, str) or not _ENCODING_RE.match(enc):
            raise ValueError(
                f"codec {codec.name!r}: encoding {enc!r} must be lower-case letters and digits"
            )
    if not isinstance(codec.fixed_width, bool):
        raise ValueError(f"codec {codec.name!r}: fixed_width must be a bool")
    return codec


def register_codec(codec: Codec, *, replace: bool = False) -> None:
    """Use ``codec`` for its encodings, in ``build_shards`` and in the loader.

    An encoding that already has a codec (a library one included) is a ValueError naming it
    unless ``replace=True``; :func:`unregister_codec` undoes the registration. Loaders and
    builds already constructed keep the codecs they resolved (and take them to their worker
    processes). Register it before reading such a dataset too: the loader reads an encoding
    without a codec as raw bytes (the WebDataset convention for unknown extensions).
    """
    _ensure_loaded()
    codec = _check(codec)
    taken = {enc: _CODECS[enc] for enc in codec.encodings if enc in _CODECS}
    if taken and not replace:
        shown = ", ".join(f"{enc!r} ({c.name})" for enc, c in taken.items())
        raise ValueError(
            f"encodings already have a codec: {shown}; pass replace=True to override them"
        )
    for enc in codec.encodings:
        _CODECS[enc] = codec


def unregister_codec(codec: Codec) -> None:
    """Undo :func:`register_codec`: its encodings go back to the library's codec, if any."""
    for enc in codec.encodings:
        if _CODECS.get(enc) is codec:
            library = _LIBRARY.get(enc)
            if library is None:
                del _CODECS[enc]
            else:
                _CODECS[enc] = library


def register_library_codec(codec: Codec) -> None:
    """Register one of the library's own codecs (a no-op for an encoding it already has)."""
    for enc in _check(codec).encodings:
        _LIBRARY.setdefault(enc, codec)
        _CODECS.setdefault(enc, codec)


def _ensure_loaded() -> None:
    """Import the modules that register the library's codecs (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        seams.load_provider(CODECS_SEAM)
    except LookupError:  # the package root names the provider; without it, the pure ones
        pass


def get_codec(encoding: str) -> Codec | None:
    """The codec of ``encoding`` (case-insensitive), or None: bytes stored as they are."""
    _ensure_loaded()
    return _CODECS.get(encoding.lower())


def require_codec(encoding: str, field: str) -> Codec:
    """The codec of ``field``'s ``encoding``; :class:`UnknownEncodingError` naming the field and
    the registered encodings when there is none."""
    codec = get_codec(encoding)
    if codec is None:
        raise UnknownEncodingError(
            f"field {field!r}: no codec is registered for encoding {encoding!r} (registered: "
            f"{', '.join(registered_encodings())}); register one with "
            "wdsloader.format.register_codec, or store bytes"
        )
    return codec


def registered_encodings() -> list[str]:
    """Every encoding with a codec, sorted."""
    _ensure_loaded()
    return sorted(_CODECS)


def is_library_codec(codec: Codec) -> bool:
    """Whether ``codec`` is one of the library's own (not a user's replacement)."""
    return any(_LIBRARY.get(enc) is codec for enc in codec.encodings)


def user_codecs() -> dict[str, Codec]:
    """``{encoding: codec}`` of the codecs a user registered (library ones left out)."""
    _ensure_loaded()
    return {enc: c for enc, c in _CODECS.items() if _LIBRARY.get(enc) is not c}


def library_decoders() -> dict[str, Callable[[Any], Any]]:
    """``{encoding: decode function}`` of the library's codecs."""
    _ensure_loaded()
    return {enc: decoder_of(c) for enc, c in _LIBRARY.items()}


def is_fixed_width(encoding: str) -> bool:
    """Whether the codec of ``encoding`` is fixed-width (see :class:`Codec`); False without one.

    Looks only at codecs already registered: the library's fixed-width one (``npy``) is
    registered with this layer, so no provider is imported here."""
    codec = _CODECS.get(encoding.lower())
    return codec is not None and codec.fixed_width
