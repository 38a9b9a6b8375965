"""Image members to ``uint8`` HWC arrays: JPEGs through simplejpeg when it is installed (the
same pixels as Pillow, about 1.5x faster, and it releases the GIL), everything else and every
JPEG simplejpeg does not take (CMYK, damaged files) through Pillow; and a batch's images decoded
on a small thread pool.

Measured in bench/experiments/jpeg_decoders.py (256x256 photo-like JPEGs, quality 90): Pillow
685 CPU µs per image, simplejpeg 459, PyTurboJPEG 483, all pixel-identical; half-size DCT
scaling 409 (Pillow's ``draft``) and 298 (simplejpeg).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from wdsloader import batch_arrays

Buffer = bytes | bytearray | memoryview

BACKENDS = ("auto", "simplejpeg", "pillow")
IMAGE_THREADS = 2
"""Threads that decode the images of one batch (both decoders release the GIL while decoding:
a pool of 2 decoded 1.9-2.2x the JPEGs per second of one thread; bench/experiments)."""

_JPEG_SOI = b"\xff\xd8"
_SCALES = (8, 4, 2, 1)  # the DCT scalings Pillow's draft and simplejpeg both make
_SIMPLE_COLORS = {"YCbCr": "RGB", "RGB": "RGB", "Gray": "GRAY"}  # JPEG colour space -> ours


def _simplejpeg() -> Any:
    """The simplejpeg module, or None when it is not installed."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def _pillow_target(img: Any) -> str:
    """The mode an image of Pillow's ``img.mode`` is converted to (see :func:`decode_image`)."""
    mode = img.mode
    if mode in ("L", "RGB", "RGBA"):
        return str(mode)
    if mode == "1" or mode.startswith("I") or mode == "F":
        return "L"
    if mode in ("LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in img.info):
        return "RGBA"
    return "RGB"


def dct_scale(height: int, width: int, size: tuple[int, int]) -> int:
    """The denominator ``s`` (8, 4, 2 or 1) of the DCT scaling that decodes a ``height x width``
    JPEG at no less than ``size = (h, w)``: the largest with ``s <= min(height // h, width //
    w)`` (Pillow's ``Image.draft`` rule); the image decodes to ``ceil(height / s) x ceil(width
    / s)``."""
    fits = min(height // size[0], width // size[1])
    return next((s for s in _SCALES if fits >= s), 1)


def _decode_pillow(buf: Buffer, size: tuple[int, int] | None) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "decoding images needs Pillow: pip install pillow (or wdsloader[image])"
        ) from None
    with Image.open(io.BytesIO(bytes(buf))) as img:
        if size is not None and img.format == "JPEG":
            img.draft(None, (size[1], size[0]))
        target = _pillow_target(img)
        arr = np.array(img if target == img.mode else img.convert(target), dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def _decode_simplejpeg(sj: Any, buf: Buffer, size: tuple[int, int] | None) -> np.ndarray | None:
    """The JPEG ``buf`` through simplejpeg, or None where Pillow is to decode it (not a JPEG, a
    colour space Pillow converts itself, or anything simplejpeg refuses: Pillow then gives its
    own value or error)."""
    if bytes(buf[:2]) != _JPEG_SOI:
        return None
    try:
        height, width, space, _ = sj.decode_jpeg_header(buf)
        colorspace = _SIMPLE_COLORS.get(space)
        if colorspace is None:
            return None
        if size is None:
            return sj.decode_jpeg(buf, colorspace, False, False)
        s = dct_scale(height, width, size)
        h, w = -(-height // s), -(-width // s)
        return sj.decode_jpeg(buf, colorspace, False, False, h, w, s)
    except (ValueError, TypeError):
        return None


def decode_image(buf: Buffer) -> np.ndarray:
    """An image member as a ``uint8`` array of shape ``(H, W, C)``: what Pillow decodes.

    Grey-scale and bi-level images give ``C == 1``; images with an alpha channel (or a palette
    with transparency) give RGBA, ``C == 4``; every other mode is converted to RGB, ``C == 3``.
    Animated images give their first frame. JPEGs are decoded by simplejpeg when it is
    installed (the same libjpeg-turbo decode, the same pixels), otherwise by Pillow;
    :class:`ImageDecoder` chooses the backend or a reduced size.
    """
    sj = _simplejpeg()
    if sj is not None:
        arr = _decode_simplejpeg(sj, buf, None)
        if arr is not None:
            return arr
    return _decode_pillow(buf, None)


class ImageDecoder:
    """A configured image decoder, registered for an encoding in place of
    :func:`decode_image`: ``register_decoder("jpg", ImageDecoder(decode_size=(128, 128)),
    replace=True)``.

    ``decode_size=(h, w)``: JPEGs are decoded at a reduced size by libjpeg's DCT scaling, the
    cheapest resize there is (half size: 0.45-0.65x the time of a full decode): the smallest of
    1/8, 1/4, 1/2 and full size that is at least ``(h, w)`` (see :func:`dct_scale`), not resized
    further (crop or resize to the exact size in your transform). Other formats decode at full
    size. ``backend``: ``"auto"`` (simplejpeg when installed, else Pillow), ``"simplejpeg"``
    (an ImportError when it is not installed) or ``"pillow"``; every backend gives the same
    pixels for the same libjpeg-turbo.
    """

    __slots__ = ("backend", "decode_size")

    def __init__(self, decode_size: tuple[int, int] | None = None, backend: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if decode_size is not None:
            h, w = (int(v) for v in decode_size)
            if h < 1 or w < 1:
                raise ValueError(f"decode_size must be two positive ints, got {decode_size!r}")
            decode_size = (h, w)
        self.decode_size = decode_size
        self.backend = backend

    def __call__(self, buf: Buffer) -> np.ndarray:
        if self.backend != "pillow":
            sj = _simplejpeg()
            if sj is None and self.backend == "simplejpeg":
                raise ImportError(
                    "ImageDecoder(backend='simplejpeg') needs simplejpeg: pip install simplejpeg"
                    " (or wdsloader[image])"
                )
            if sj is not None:
                arr = _decode_simplejpeg(sj, buf, self.decode_size)
                if arr is not None:
                    return arr
        return _decode_pillow(buf, self.decode_size)

    def __getstate__(self) -> tuple[tuple[int, int] | None, str]:
        return self.decode_size, self.backend

    def __setstate__(self, state: tuple[tuple[int, int] | None, str]) -> None:
        self.decode_size, self.backend = state

    def __repr__(self) -> str:
        return f"ImageDecoder(decode_size={self.decode_size!r}, backend={self.backend!r})"


def is_image_decoder(fn: Callable[[Any], Any]) -> bool:
    """Whether ``fn`` is the library's image decoder (:func:`decode_image` or an
    :class:`ImageDecoder`), whose decoding releases the GIL."""
    return fn is decode_image or isinstance(fn, ImageDecoder)


_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def decode_pool() -> ThreadPoolExecutor:
    """This process's pool of :data:`IMAGE_THREADS` image threads (a forked worker makes its
    own)."""
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():
        _pool = ThreadPoolExecutor(IMAGE_THREADS, thread_name_prefix="wdsloader-image")
        _pool_pid = os.getpid()
    return _pool


def image_column(
    fn: Callable[[Any], Any], buf: Any, positions: np.ndarray, sizes: np.ndarray
) -> np.ndarray | list[Any] | None:
    """``fn`` (an image decoder, possibly with the schema's checks after it) of each member
    ``buf[p : p + n]``, in order: JPEGs of one size decoded straight into one ``(n, H, W, C)``
    batch array (:func:`jpeg_batch`), else each decoded on :func:`decode_pool`; None when one
    raises (the column is then decoded sample by sample, so that each error names its
    sample)."""
    view = memoryview(buf)
    members: Sequence[memoryview] = [
        view[p : p + n] for p, n in zip(positions.tolist(), sizes.tolist(), strict=True)
    ]
    if len(members) < 2:
        return None
    batch = jpeg_batch(fn, members)
    if batch is not None:
        return batch

    def one(member: memoryview) -> Any:
        try:
            return fn(member)
        except Exception:
            return _FAILED

    out = list(decode_pool().map(one, members))
    return None if any(v is _FAILED for v in out) else out


_FAILED = object()


def jpeg_batch(fn: Callable[[Any], Any], members: Sequence[memoryview]) -> np.ndarray | None:
    """The JPEGs ``members`` decoded by simplejpeg straight into the rows of one ``uint8
    (n, H, W, C)`` array (no array per image, no stacking copy; the same pixels ``fn`` gives),
    split between the calling thread and :func:`decode_pool`; None unless ``fn`` is an image
    decoder (and checks) that uses simplejpeg, simplejpeg is installed, and every member is a
    JPEG of the first one's size and colour space that decodes and passes the checks."""
    inner: Any = getattr(fn, "fn", None)  # a decode.checks.Then: the decoder, then its checks
    post: Any = getattr(fn, "post", None)
    dec, post = (inner, post) if is_image_decoder(inner) else (fn, None)
    if not is_image_decoder(dec) or getattr(dec, "backend", "auto") == "pillow":
        return None
    sj = _simplejpeg()
    if sj is None:
        return None
    size = getattr(dec, "decode_size", None)
    try:
        if any(bytes(m[:2]) != _JPEG_SOI for m in members):
            return None
        headers = {sj.decode_jpeg_header(m)[:3] for m in members}
    except (ValueError, TypeError):
        return None
    if len(headers) != 1:
        return None
    ((height, width, space),) = headers
    colorspace = _SIMPLE_COLORS.get(space)
    if colorspace is None:
        return None
    s = 1 if size is None else dct_scale(height, width, size)
    h, w = -(-height // s), -(-width // s)
    out = batch_arrays.empty((len(members), h, w, 3 if colorspace == "RGB" else 1), np.uint8)

    def rows(lo: int, hi: int) -> bool:
        try:
            for j in range(lo, hi):
                got = sj.decode_jpeg(members[j], colorspace, False, False, h, w, s, out[j])
                if got.shape != out.shape[1:] or (post is not None and post(got) is not got):
                    return False
        except Exception:  # noqa: BLE001 - the column goes sample by sample, errors named there
            return False
        return True

    cuts = np.linspace(0, len(members), IMAGE_THREADS + 1).astype(int).tolist()
    futures = [decode_pool().submit(rows, a, b) for a, b in zip(cuts[1:-1], cuts[2:], strict=True)]
    ok = rows(cuts[0], cuts[1])
    return out if all([ok, *(f.result() for f in futures)]) else None
