"""Codecs: member bytes to Python/numpy values, one function per encoding.

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
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from wdsloader.errors import PickleNotAllowedError
from wdsloader.format.npy import read_npy_header

Buffer = bytes | bytearray | memoryview
Decoder = Callable[[Any], Any]


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
    stdlib's C scanner on small objects; bench/experiments/json_parsers.py)."""
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
# The default decoder of each encoding: safe for untrusted data.
DEFAULT_DECODERS: dict[str, Decoder] = {
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
