"""Whole-batch decoders for small members: one numpy pass per column instead of one Python
call per sample, giving exactly what the per-sample decoder gives.

:func:`batch_decoder` maps a field's decode function (as :meth:`SampleDecoder.field_decoder`
returns it) to a column function ``(buf, positions, sizes) -> values | None``: ``.cls``-style
ints (ASCII digits parsed for the whole batch at once, cast to the schema's dtype), ``.txt``
(one UTF-8 decode per batch), ``.json`` (one tight loop over msgspec, when installed), bytes
declared ``uint8`` (one copy into one buffer per batch, the values views into it) and images
(decoded on a small thread pool: :func:`wdsloader.decode.images.image_column`). None means
"decode this column sample by sample": any member the vectorised form does not cover exactly
(signs other than a leading ``-``, whitespace, underscores, more than 18 digits, a value outside
the dtype, non-ASCII text, an image that fails to decode) sends the whole column there, so
values and error messages stay the per-sample decoder's.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from wdsloader.decode.codecs import (
    decode_bytes,
    decode_int,
    decode_json,
    decode_text,
    decode_uint8,
)
from wdsloader.decode.images import image_column, is_image_decoder
from wdsloader.decode.registry import ClsCast, Then
from wdsloader.io.buffers import BufferPool

ColumnFn = Callable[[np.ndarray, np.ndarray, np.ndarray], Any]

MAX_DIGITS = 18  # every 18-digit decimal fits int64
_POWERS = 10 ** np.arange(MAX_DIGITS, -1, -1, dtype=np.int64)  # a sign column too
_MINUS = ord("-")
_ZERO = ord("0")


def batch_decoder(fn: Callable[[Any], Any]) -> ColumnFn | None:
    """The column form of decode function ``fn``, or None when it has none."""
    if fn is decode_int:
        return _IntColumn(None)
    if isinstance(fn, Then) and fn.fn is decode_int and isinstance(fn.post, ClsCast):
        return _IntColumn(fn.post.dtype)
    if fn is decode_text:
        return _text_column
    if fn is decode_uint8:
        return bytes_column
    if fn is decode_bytes:
        return _bytes_values
    if fn is decode_json and _MSGSPEC is not None:
        return _json_column
    if is_image_decoder(fn) or (isinstance(fn, Then) and is_image_decoder(fn.fn)):
        return partial(image_column, fn)  # the images of a batch on a few threads
    return None


def parse_ints(buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """The members ``buf[p : p + n]`` read as decimal ints (int64), or None unless every one is
    1 to 18 ASCII digits, optionally led by ``-``."""
    if not len(sizes):
        return np.zeros(0, dtype=np.int64)
    width = int(sizes.max())
    if width > MAX_DIGITS + 1 or int(sizes.min()) < 1:
        return None
    # right-aligned: column c of row j is byte c - (width - n_j) of member j (masked if < 0)
    cols = np.arange(width, dtype=np.int64)
    lead = (width - sizes).astype(np.int64)[:, None]
    inside = cols[None, :] >= lead
    index = positions.astype(np.int64)[:, None] + cols[None, :] - lead
    np.clip(index, 0, len(buf) - 1, out=index)
    chars = buf[index]
    negative = chars[np.arange(len(sizes)), lead[:, 0]] == _MINUS
    if ((sizes - negative) > MAX_DIGITS).any():
        return None  # 19 digits may not fit int64
    if negative.any():
        if int(sizes[negative].min()) < 2:
            return None  # a bare "-"
        inside[negative, lead[negative, 0]] = False  # the sign is no digit
    digits = chars - np.uint8(_ZERO)  # wraps below "0": not a digit either
    digits[~inside] = 0
    if (digits > 9).any():
        return None
    values = digits.astype(np.int64) @ _POWERS[MAX_DIGITS + 1 - width :]
    return np.where(negative, -values, values)


class _IntColumn:
    """``.cls``/``.index``/``.id`` ints: Python ints without a schema dtype, else an array of
    the dtype (what the per-sample path's numpy scalars collate to)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype | None) -> None:
        self.dtype = dtype

    def __call__(self, buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> Any:
        values = parse_ints(buf, positions, sizes)
        if values is None:
            return None
        if self.dtype is None:
            return values.tolist()
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            if len(values) and (values.min() < info.min or values.max() > info.max):
                return None  # the per-sample path raises the schema error
        elif self.dtype.kind == "b":
            return None
        return values.astype(self.dtype)


def _text_column(buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> list[str] | None:
    """UTF-8 text members decoded in one piece when the batch's text is ASCII."""
    view = memoryview(buf)  # type: ignore[arg-type]
    ends = positions + sizes
    joined = b"".join([view[p:e] for p, e in zip(positions.tolist(), ends.tolist(), strict=True)])
    if not joined.isascii():
        return None
    text = joined.decode("ascii")
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [text[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _msgspec_json() -> tuple[Callable[[Any], Any], type[Exception]] | None:
    """msgspec's JSON decoder and its error type, when msgspec is installed."""
    try:
        import msgspec
    except ImportError:
        return None
    return msgspec.json.Decoder().decode, msgspec.MsgspecError


_MSGSPEC = _msgspec_json()


def _json_column(buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> list[Any] | None:
    """JSON members, each decoded by msgspec in one loop (what :func:`decode_json` returns:
    it tries msgspec first); None when msgspec refuses one (a NaN, a BOM...), so that the
    column goes sample by sample, through the stdlib where msgspec refuses."""
    assert _MSGSPEC is not None
    decode, refused = _MSGSPEC
    view = memoryview(buf)  # type: ignore[arg-type]
    ends = (positions + sizes).tolist()
    try:
        return [decode(view[p:e]) for p, e in zip(positions.tolist(), ends, strict=True)]
    except refused:
        return None


def _bytes_values(buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray) -> Any:
    """Undeclared bytes members, each copied once to its ``bytes`` (what :func:`decode_bytes`
    returns); None when one lies past the buffer."""
    ends = positions + sizes
    if len(positions) and (positions.min() < 0 or ends.max() > len(buf)):
        return None
    view = memoryview(buf)  # type: ignore[arg-type]
    return [bytes(view[p:e]) for p, e in zip(positions.tolist(), ends.tolist(), strict=True)]


POOLED_BYTES = 2**20  # a batch's bytes column from this size on: in a block of the pool


def bytes_column(
    buf: np.ndarray, positions: np.ndarray, sizes: np.ndarray, pool: BufferPool | None = None
) -> Any:
    """Bytes members declared ``uint8``, copied once into one buffer for the batch (leased
    from ``pool`` when it is large: memory faulted in already, that returns to the pool only
    once nothing refers to the batch's values): a ``(n, size)`` array when they have one size
    (what the default collator stacks the per-sample arrays into), else a list of 1-D views
    into the buffer (``buf[p : p + n]`` for each member)."""
    total = int(sizes.sum())
    if len(positions) and (positions.min() < 0 or (positions + sizes).max() > len(buf)):
        return None
    big = pool is not None and total >= POOLED_BYTES
    joined = pool.lease(total) if big else np.empty(total, dtype=np.uint8)  # type: ignore[union-attr]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    for j, p in enumerate(positions.tolist()):
        a, b = bounds[j], bounds[j + 1]
        joined[a:b] = buf[p : p + b - a]
    if len(sizes) and (sizes == sizes[0]).all():
        return joined.reshape(len(sizes), int(sizes[0]))
    return [joined[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
