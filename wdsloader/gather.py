"""Whole-batch reads of fixed-size fields, straight from the shard bytes.

Our writer puts fixed-size fields first and records, per shard, where each member's data sits
relative to the sample's first header (:attr:`wdsloader.format.ShardInfo.layout`). With the
sample starts from the ``.tar.idx``, a field of a whole batch is then one numpy gather over
the buffer holding the read bytes, instead of a header parse and a decode per sample.

Everything here is a pure function of numpy arrays. Anything unexpected (a header that is not
plain ustar, ``.npy`` headers that differ between samples, a range past the buffer) makes the
functions return None, and the caller falls back to parsing samples one by one, which also
words the errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from wdsloader.decode import read_npy_header
from wdsloader.format.manifest import FieldSpec, ShardInfo
from wdsloader.format.tar import BLOCK, padded

_NAME = 100  # bytes of the ustar name field
_TYPEFLAG = 156
_DOT, _SLASH = ord("."), ord("/")
_PREFIX = 345  # first byte of the ustar prefix field


def gather_rows(buf: np.ndarray, positions: np.ndarray, nbytes: int) -> np.ndarray | None:
    """``buf[p : p + nbytes]`` for every ``p`` in ``positions`` as one ``(n, nbytes)`` array.

    None when a row would leave the buffer.
    """
    if len(positions) == 0:
        return np.empty((0, nbytes), dtype=np.uint8)
    if positions.min() < 0 or positions.max() + nbytes > len(buf):
        return None
    if nbytes == 0:
        return np.empty((len(positions), 0), dtype=np.uint8)
    return sliding_window_view(buf, nbytes)[positions]


def sample_keys(buf: np.ndarray, starts: np.ndarray) -> list[str] | None:
    """The sample key of each sample, read from the name of its first tar header.

    None unless every first header is a plain ustar regular member (no extension header, no
    prefix, no directory part) named ``KEY.EXT``: the caller then parses those samples.
    """
    headers = gather_rows(buf, starts, BLOCK)
    return None if headers is None else keys_from_headers(headers)


def keys_from_headers(headers: np.ndarray) -> list[str] | None:
    """:func:`sample_keys` from the ``(n, >= 512)`` first headers of the samples."""
    flags = headers[:, _TYPEFLAG]
    if not ((flags == 0x30) | (flags == 0) | (flags == 0x37)).all():  # '0', NUL, '7'
        return None
    if (headers[:, _PREFIX] != 0).any():  # a ustar prefix (or an old-style header's data)
        return None
    names = headers[:, :_NAME]
    if (names == _SLASH).any():
        return None
    dot = names == _DOT
    if not dot.any(axis=1).all():
        return None
    ends = dot.argmax(axis=1)
    if (ends == 0).any():
        return None
    blob = names.tobytes()
    width = names.shape[1]
    return [
        blob[i * width : i * width + e].decode("utf-8", "surrogateescape")
        for i, e in enumerate(ends.tolist())
    ]


_SIZE = slice(124, 136)
_OCTAL = 8 ** np.arange(10, -1, -1, dtype=np.int64)
MAX_MEMBERS = 64


def member_sizes(headers: np.ndarray) -> np.ndarray | None:
    """The size fields of ``(n, 512)`` tar headers, when all are 11 octal digits and a NUL or
    space (what our writer and GNU tar write); else None."""
    field = headers[:, _SIZE]
    digits = field[:, :11].astype(np.int64) - 48
    if ((digits < 0) | (digits > 7)).any() or not (
        (field[:, 11] == 0) | (field[:, 11] == 32)
    ).all():
        return None
    return digits @ _OCTAL


def walk_members(
    buf: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    keys: Sequence[str],
    first_headers: np.ndarray | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The members lying in ``buf[starts[j]:stops[j]]`` for every sample ``j`` at once:
    ``{ext: (data positions, sizes)}``. ``first_headers`` may hold the ``(n, 512)`` headers at
    ``starts`` when the caller has them already.

    Every sample must hold the same extensions in the same order, in plain ustar headers named
    ``KEY.EXT`` with the sample's own key; otherwise None (the caller parses sample by sample).
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    pos = np.asarray(starts, dtype=np.int64).copy()
    encoded = [k.encode("utf-8", "surrogateescape") + b"." for k in keys]
    for _ in range(MAX_MEMBERS):
        active = pos < stops
        if not active.any():
            return out
        if not active.all():
            return None  # samples with different numbers of members
        if first_headers is not None:
            headers, first_headers = first_headers, None
        else:
            headers = gather_rows(buf, pos, BLOCK)
        if headers is None:
            return None
        flags = headers[:, _TYPEFLAG]
        if not ((flags == 0x30) | (flags == 0) | (flags == 0x37)).all():
            return None
        if (headers[:, _PREFIX] != 0).any():
            return None
        sizes = member_sizes(headers)
        if sizes is None:
            return None
        ext = _common_ext(headers[:, :_NAME], encoded)
        if ext is None or ext in out:
            return None
        data = pos + BLOCK
        out[ext] = (data, sizes)
        pos = data + (sizes + BLOCK - 1) // BLOCK * BLOCK
        if (pos > stops).any():
            return None
    return None


def _common_ext(names: np.ndarray, prefixes: Sequence[bytes]) -> str | None:
    """The extension shared by ``names`` (rows of ustar name fields), each of which must be its
    sample's ``KEY.`` followed by it; else None."""
    width = names.shape[1]
    blob = names.tobytes()
    first = blob[:width].split(b"\0", 1)[0]
    if not first.startswith(prefixes[0]):
        return None
    ext_bytes = first[len(prefixes[0]) :]
    if not ext_bytes:
        return None
    for i, prefix in enumerate(prefixes):
        name = prefix + ext_bytes
        at = i * width
        if blob[at : at + len(name)] != name or (len(name) < width and blob[at + len(name)]):
            return None
    return ext_bytes.decode("utf-8", "surrogateescape").lower()


def prefix_end(layout: Mapping[str, Sequence[int]] | None) -> int:
    """Offset of the first member header that follows the members at constant offsets.

    The writer keeps one member order in every sample, so the members whose offset and size
    never change form a prefix of each sample; the remaining (variable) members start here.
    """
    if not layout:
        return 0
    by_header = {int(off) - BLOCK: int(off) + padded(int(size)) for off, size in layout.values()}
    pos = 0
    while pos in by_header:
        pos = by_header[pos]
    return pos


class FieldTable:
    """Per shard, where a fixed-size ``.npy`` field's member data starts in each sample.

    ``offsets[s]`` is the offset from the sample start in shard ``s``, or -1 when that shard's
    layout does not fix it.
    """

    __slots__ = ("dtype", "ext", "nbytes", "offsets", "shape")

    def __init__(self, spec: FieldSpec, shape: tuple[int, ...], shards: Sequence[ShardInfo]):
        self.ext = spec.ext.lower()
        self.dtype = np.dtype(spec.dtype)
        self.shape = shape
        sizes = set()
        offsets = np.full(len(shards), -1, dtype=np.int64)
        for s, shard in enumerate(shards):
            entry = (shard.layout or {}).get(self.ext)
            if entry is not None:
                offsets[s] = int(entry[0])
                sizes.add(int(entry[1]))
        if len(sizes) > 1:  # shards disagree on the member size: never gather
            offsets[:] = -1
        self.offsets = offsets
        self.nbytes = sizes.pop() if len(sizes) == 1 else -1

    def positions(self, starts: np.ndarray, shard_idx: np.ndarray) -> np.ndarray | None:
        """Where this field's member data begins for each sample, or None if unknown."""
        offs = self.offsets[shard_idx]
        if (offs < 0).any():
            return None
        return starts + offs

    def _data_span(self, member: np.ndarray) -> tuple[int, int] | None:
        """``(header length, data bytes)`` of one sample's ``.npy`` member bytes, when they
        hold the declared dtype and shape in C order; else None."""
        try:
            dtype, shape, fortran, data_off = read_npy_header(member)
        except ValueError:
            return None
        if dtype != self.dtype or shape != self.shape or fortran or dtype.hasobject:
            return None
        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return None if data_off + count > self.nbytes else (data_off, count)

    def gather(self, buf: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        """The field of every sample as one ``(n, *shape)`` array (a fresh copy).

        None when the ``.npy`` headers differ between samples, or do not match the declared
        dtype and shape.
        """
        if len(positions) == 0:
            return np.empty((0, *self.shape), dtype=self.dtype)
        first = int(positions[0])
        span = self._data_span(buf[first : first + self.nbytes])
        if span is None:
            return None
        data_off, count = span
        headers = gather_rows(buf, positions, data_off)
        if headers is None or not (headers == headers[0]).all():
            return None
        rows = gather_rows(buf, positions + data_off, count)
        if rows is None:
            return None
        return rows.view(self.dtype).reshape(len(positions), *self.shape)

    def from_block(self, block: np.ndarray, offset: int) -> np.ndarray | None:
        """:meth:`gather` from rows already gathered: the member data of sample ``j`` is
        ``block[j, offset : offset + nbytes]``."""
        if len(block) == 0:
            return np.empty((0, *self.shape), dtype=self.dtype)
        span = self._data_span(block[0, offset : offset + self.nbytes])
        if span is None:
            return None
        data_off, count = span
        headers = block[:, offset : offset + data_off]
        if not (headers == headers[0]).all():
            return None
        start = offset + data_off
        data = np.ascontiguousarray(block[:, start : start + count])
        return data.view(self.dtype).reshape(len(block), *self.shape)


def field_tables(
    schema: Mapping[str, FieldSpec],
    fields: Sequence[str],
    dims: Mapping[str, int],
    shards: Sequence[ShardInfo],
) -> dict[str, FieldTable]:
    """A :class:`FieldTable` for each of ``fields`` that is a fixed-size ``.npy`` field."""
    out: dict[str, FieldTable] = {}
    for name in fields:
        spec = schema.get(name)
        if spec is None or spec.encoding != "npy" or spec.dtype is None or spec.shape is None:
            continue
        shape = resolve_shape(spec.shape, dims)
        if shape is None:
            continue
        try:
            table = FieldTable(spec, shape, shards)
        except TypeError:
            continue
        if table.nbytes >= 0:
            out[name] = table
    return out


def resolve_shape(shape: Sequence[int | str], dims: Mapping[str, int]) -> tuple[int, ...] | None:
    """A declared shape with its symbolic dims replaced by their sizes, or None if one is
    unbound."""
    out = []
    for d in shape:
        if isinstance(d, str):
            if d not in dims:
                return None
            out.append(int(dims[d]))
        else:
            out.append(int(d))
    return tuple(out)
