"""The ``.npy`` header: where an array's dtype, shape and data start inside a member's bytes.

Shared by the read side (decoders, whole-batch gathering) and ``build_shards.adopt``.
"""

from __future__ import annotations

import ast
import math

import numpy as np

Buffer = bytes | bytearray | memoryview | np.ndarray

_NPY_MAGIC = b"\x93NUMPY"
_NPY_CACHE: dict[bytes, tuple[np.dtype, tuple[int, ...], bool, int]] = {}
_NPY_CACHE_MAX = 4096


def _npy_header(header: bytes, major: int) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, count)`` from the text of a .npy header (cached)."""
    cached = _NPY_CACHE.get(header)
    if cached is not None:
        return cached
    text = header.decode("utf-8" if major >= 3 else "latin1")
    try:
        meta = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"bad .npy header {text.strip()!r}: {exc}") from None
    if not isinstance(meta, dict) or set(meta) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"bad .npy header {text.strip()!r}: expected descr, fortran_order, shape")
    shape = meta["shape"]
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"bad .npy header: shape {shape!r} is not a tuple of sizes")
    if not isinstance(meta["fortran_order"], bool):
        raise ValueError(f"bad .npy header: fortran_order {meta['fortran_order']!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(meta["descr"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad .npy header: descr {meta['descr']!r}: {exc}") from None
    parsed = (dtype, shape, meta["fortran_order"], math.prod(shape))
    if len(_NPY_CACHE) >= _NPY_CACHE_MAX:
        _NPY_CACHE.clear()
    _NPY_CACHE[header] = parsed
    return parsed


def read_npy_header(buf: Buffer) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, data_offset)`` of the ``.npy`` bytes in ``buf``.

    Raises ValueError on a bad magic, version or header. Parses are cached by header bytes.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)  # type: ignore[arg-type]
    if len(view) < 10 or view[:6] != _NPY_MAGIC:
        raise ValueError("not a .npy file (bad magic)")
    major = view[6]
    if major == 1:
        hstart = 10
        hlen = view[8] | view[9] << 8
    elif major in (2, 3):
        hstart = 12
        hlen = int.from_bytes(view[8:12], "little")
    else:
        raise ValueError(f"unsupported .npy format version {major}.{view[7]}")
    dtype, shape, fortran, _ = _npy_header(bytes(view[hstart : hstart + hlen]), major)
    return dtype, shape, fortran, hstart + hlen
