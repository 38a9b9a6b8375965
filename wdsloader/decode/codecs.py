"""Codecs: member bytes to Python/numpy values, one function per encoding; the library codecs
whose decoding needs Pillow or torch register here (see :mod:`wdsloader.format.codecs`).

The default table (:data:`DEFAULT_DECODERS`) is safe: ``.npy`` is parsed without pickle,
``torch.load`` runs with ``weights_only=True`` and pickle members are refused;
:data:`TRUSTED_DECODERS` is what ``allow_pickle=True`` swaps in. Pillow and torch are imported
only when an image or a ``.pt`` member is decoded. The registry and :class:`SampleDecoder` live
in :mod:`wdsloader.decode.registry`, the sample parser in :mod:`wdsloader.decode.parse`; their
names stay importable from here.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from wdsloader.decode.images import decode_image
from wdsloader.errors import PickleNotAllowedError
from wdsloader.format.builtin_codecs import (
    PICKLE_HINT,
    decode_bytes,
    decode_int,
    decode_json,
    decode_npy,
    decode_text,
)
from wdsloader.format.codecs import FunctionCodec, library_decoders, register_library_codec

Buffer = bytes | bytearray | memoryview
Decoder = Callable[[Any], Any]

__all__ = [
    "DEFAULT_DECODERS",
    "IMAGE_ENCODINGS",
    "PICKLE_ENCODINGS",
    "TRUSTED_DECODERS",
    "Buffer",
    "Decoder",
    "decode_bytes",
    "decode_image",
    "decode_int",
    "decode_json",
    "decode_npy",
    "decode_npz",
    "decode_pickle_refused",
    "decode_pt",
    "decode_text",
    "decode_uint8",
]


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
                f"the .npz holds object arrays, which need pickle to load; {PICKLE_HINT}"
            ) from None
        raise


def decode_npz(buf: Buffer) -> dict[str, np.ndarray]:
    """A ``.npz`` member as ``{name: array}`` (``allow_pickle=False``)."""
    return _load_npz(buf, allow_pickle=False)


def _decode_npz_trusted(buf: Buffer) -> dict[str, np.ndarray]:
    return _load_npz(buf, allow_pickle=True)


def decode_uint8(buf: Buffer) -> np.ndarray:
    """A raw-bytes member declared ``dtype: "uint8"`` in the schema: its bytes as a 1-D uint8
    array (a copy), which the default collator stacks when a batch's members have one length."""
    return np.frombuffer(buf, dtype=np.uint8).copy()


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
        + PICKLE_HINT
    )


def _decode_pickle_trusted(buf: Buffer) -> Any:
    import pickle

    return pickle.loads(bytes(buf))  # noqa: S301 - explicit opt-in via allow_pickle=True


IMAGE_ENCODINGS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
PICKLE_ENCODINGS = ("pkl", "pickle", "pyd")
# The library's codecs whose decoding needs Pillow or torch, or is refused (pickle); the pure ones
# (npy, json, txt, cls and aliases) are registered by wdsloader.format.builtin_codecs. Their bytes
# are written as they are (the builder encodes PIL images itself).
for _codec in (
    FunctionCodec("npz", decode_npz),
    FunctionCodec("pt", decode_pt, encodings=("pt", "pth")),
    FunctionCodec("image", decode_image, encodings=IMAGE_ENCODINGS),
    FunctionCodec("pickle", decode_pickle_refused, encodings=PICKLE_ENCODINGS),
):
    register_library_codec(_codec)

# The default decoder of each encoding (the library codecs' decoders): safe for untrusted data.
DEFAULT_DECODERS: dict[str, Decoder] = library_decoders()

# What ``allow_pickle=True`` swaps in: the caller said the data are trusted.
TRUSTED_DECODERS: dict[str, Decoder] = {
    "npy": _decode_npy_trusted,
    "npz": _decode_npz_trusted,
    "pt": _decode_pt_trusted,
    "pth": _decode_pt_trusted,
    **{enc: _decode_pickle_trusted for enc in PICKLE_ENCODINGS},
}


# names that moved out of this module, still importable from it (resolved on first use: the
# registry imports the codecs above)
_MOVED = {
    "SampleDecoder": "wdsloader.decode.registry",
    "register_decoder": "wdsloader.decode.registry",
    "get_decoder": "wdsloader.decode.registry",
    "_REGISTRY": "wdsloader.decode.registry",
    "parse_sample": "wdsloader.decode.parse",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
