"""Whole-batch reads of fixed-size fields, straight from the shard bytes.

Our writer puts fixed-size fields first and records, per shard, where each member's data sits
relative to the sample's first header (:attr:`wdsloader.format.ShardInfo.layout`). With the
sample starts from the shard's index, a field of a whole batch is then one numpy gather over
the buffer holding the read bytes, instead of a header parse and a decode per sample.

Everything here is a pure function of numpy arrays. Anything unexpected (a header that is not
plain ustar, ``.npy`` headers that differ between samples, a range past the buffer) makes the
functions return None, and the caller falls back to parsing samples one by one, which also
words the errors. Every tar header a gather relies on is checked as the parser checks it: its
checksum (:func:`checksums_ok`) and, for a field read at the layout's offset, that it is the
header of this sample's member of that field (:func:`named_members`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from wdsloader.format.keys import is_metadata
from wdsloader.format.manifest import FieldSpec, ShardInfo

if TYPE_CHECKING:
    from wdsloader.io.buffers import BufferPool
from wdsloader.format.npy import read_npy_header
from wdsloader.format.ustar import (
    BLOCK,
    NAME,
    PREFIX,
    SIZE,
    TYPEFLAG,
    name_fields,
    octal_field,
    padded,
    plain_regular,
)

_DOT, _SLASH, _UNDERSCORE = ord("."), ord("/"), ord("_")
_NAME_BYTES = NAME.stop - NAME.start


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
    prefix, no directory part) named ``KEY.EXT``: the caller then parses those samples. The
    checksums are the caller's to check (:func:`checksums_ok`).
    """
    headers = gather_rows(buf, starts, BLOCK)
    return None if headers is None else keys_from_headers(headers)


def keys_from_headers(headers: np.ndarray) -> list[str] | None:
    """:func:`sample_keys` from the ``(n, >= 512)`` first headers of the samples."""
    ends = key_ends(headers)
    return None if ends is None else key_strings(headers, ends)


def key_ends(headers: np.ndarray) -> np.ndarray | None:
    """Where the key ends (its dot) in the name of each of ``(n, >= 512)`` first headers; None
    unless each is a plain ustar regular member named ``KEY.EXT`` (see :func:`sample_keys`) as
    the row parser reads it: no directory part, no NUL before the dot, not a metadata name
    (``__NAME__``, which webdataset and the row parser skip; ``__a.txt`` is a member)."""
    if not plain_regular(headers):  # a ustar prefix (or an old-style header's data), a link...
        return None
    names = name_fields(headers)
    if (names == _SLASH).any():
        return None
    dot = names == _DOT
    ends = dot.argmax(axis=1)
    if not dot[np.arange(len(ends)), ends].all() or (ends == 0).any():
        return None  # a name without a dot, or starting with one
    led = np.flatnonzero((names[:, 0] == _UNDERSCORE) & (names[:, 1] == _UNDERSCORE))
    for j in led.tolist():  # rare: a key led by "__" (a hash...), or a metadata name
        if is_metadata(names[j].tobytes().split(b"\0", 1)[0].decode("utf-8", "surrogateescape")):
            return None  # webdataset skips such members
    nul = names == 0
    if (nul.argmax(axis=1) < ends)[nul.any(axis=1)].any():
        return None  # the name ends before its dot
    return ends


def key_strings(headers: np.ndarray, ends: np.ndarray) -> list[str]:
    """The keys named by first headers whose keys end at ``ends`` (:func:`key_ends`)."""
    if len(ends) and ends[0] > 0 and (ends == ends[0]).all():  # one length: one decode
        return fixed_keys(headers[:, : int(ends[0])])
    names = np.ascontiguousarray(name_fields(headers))
    blob = names.tobytes()
    return [
        blob[i * _NAME_BYTES : i * _NAME_BYTES + e].decode("utf-8", "surrogateescape")
        for i, e in enumerate(ends.tolist())
    ]


def fixed_keys(keys: np.ndarray) -> list[str]:
    """The keys in ``(n, width)`` bytes (``width >= 1``), one per row, as strings."""
    width = keys.shape[1]
    blob = np.ascontiguousarray(keys).tobytes()
    if blob.isascii():
        text = blob.decode("ascii")
        return [text[i : i + width] for i in range(0, len(text), width)]
    return [
        blob[i : i + width].decode("utf-8", "surrogateescape") for i in range(0, len(blob), width)
    ]


def named_members(
    headers: np.ndarray, first_names: np.ndarray, ends: np.ndarray, ext: str, size: int
) -> np.ndarray:
    """Per sample ``j``: whether ``headers[j]`` is a plain ustar header (its checksum is the
    caller's: :func:`wdsloader.format.ustar.checksums_ok`) of a regular member of ``size`` bytes named ``KEY.ext``, KEY being the key of the sample's
    first header (``first_names[j]``, its name field; the key ends at ``ends[j]``).

    A cheap filter: True proves it; False may also mean a form only the full parser reads
    (an upper-case extension, a 100-byte name, other numeric forms), to be checked by parsing.
    """
    if len(headers) == 0:
        return np.ones(0, dtype=bool)
    end = int(ends[0])
    if (ends == end).all():  # keys of one length (the usual case): constant columns
        cols, const = _constant_part(end, ext, size)
        ok = (headers[:, cols] == const).all(axis=1)
        ok &= (headers[:, : end + 1] == first_names[:, : end + 1]).all(axis=1)
    else:
        cols, const = _constant_part(-1, ext, size)
        ok = (headers[:, cols] == const).all(axis=1)
        tail = _name_tail(ext)
        at = ends[:, None] + 1 + np.arange(len(tail))
        ok &= (np.take_along_axis(headers, at, axis=1) == tail).all(axis=1)
        in_key = np.arange(_NAME_BYTES) <= ends[:, None]
        ok &= ((name_fields(headers) == first_names[:, NAME]) | ~in_key).all(axis=1)
    return ok


def _name_tail(ext: str) -> np.ndarray:
    return np.frombuffer(ext.encode("utf-8", "surrogateescape") + b"\0", dtype=np.uint8)


@functools.lru_cache(maxsize=256)
def _constant_part(end: int, ext: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns of a member header that hold the same bytes in every sample whose key ends at
    ``end`` (-1: key lengths vary), and those bytes: the extension and its NUL (when it fits
    the name field), the size field as our writer and most tools write it, the typeflag '0'
    and an empty prefix."""
    size_field = octal_field(size, SIZE.stop - SIZE.start)
    cols = [*range(SIZE.start, SIZE.stop), TYPEFLAG.start, PREFIX.start]
    const = [*size_field, 0x30, 0]
    tail = _name_tail(ext)
    if end >= 0 and end + 1 + len(tail) <= _NAME_BYTES:
        cols += range(end + 1, end + 1 + len(tail))
        const += tail.tolist()
    elif end >= 0:  # a name that fills the field: leave it to the parser
        cols, const = [0], [256]
    return np.array(cols, dtype=np.intp), np.array(const, dtype=np.int16)


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


def walk_start(layout: Mapping[str, Sequence[int]] | None, decoded: Collection[str]) -> int:
    """Offset of the first member header a walk over a sample must pass to find the members
    of the ``decoded`` extensions: the end of the constant-offset prefix (:func:`prefix_end`),
    or the header of the first member of ``decoded`` inside that prefix. Shards whose layouts
    differ only from there on (a ``.cls`` whose width is constant in some shards only) start
    their walks at one offset."""
    if not layout:
        return 0
    by_header = {
        int(off) - BLOCK: (int(off) + padded(int(size)), ext) for ext, (off, size) in layout.items()
    }
    pos = 0
    while pos in by_header and by_header[pos][1] not in decoded:
        pos = by_header[pos][0]
    return pos


class FieldTable:
    """Per shard, where a fixed-size ``.npy`` field's member data starts in each sample; with
    ``raw``, a fixed-length bytes field (no ``.npy`` header: the member's bytes are the value,
    of the layout's size): declared ``uint8`` (its rows are the values), or with ``as_bytes``
    an undeclared one (each row's ``bytes`` is the value).

    ``offsets[s]`` is the offset from the sample start in shard ``s``, or -1 when that shard's
    layout does not fix it.
    """

    __slots__ = ("as_bytes", "dtype", "ext", "nbytes", "offsets", "raw", "shape")

    def __init__(
        self,
        spec: FieldSpec,
        shape: tuple[int, ...] | None,
        shards: Sequence[ShardInfo],
        raw: bool = False,
        as_bytes: bool = False,
    ):
        self.ext = spec.ext.lower()
        self.raw = raw or as_bytes
        self.as_bytes = as_bytes
        self.dtype = np.dtype(np.uint8 if raw else spec.dtype)
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
        self.shape = (max(self.nbytes, 0),) if shape is None else shape

    def positions(self, starts: np.ndarray, shard_idx: np.ndarray) -> np.ndarray | None:
        """Where this field's member data begins for each sample, or None if unknown."""
        offs = self.offsets[shard_idx]
        if (offs < 0).any():
            return None
        return starts + offs

    def data_span(self, member: np.ndarray) -> tuple[int, int] | None:
        """``(header length, data bytes)`` of one sample's ``.npy`` member bytes, when they
        hold the declared dtype and shape in C order; else None."""
        if self.raw:
            return 0, self.nbytes
        try:
            dtype, shape, fortran, data_off = read_npy_header(member)
        except ValueError:
            return None
        if dtype != self.dtype or shape != self.shape or fortran or dtype.hasobject:
            return None
        count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return None if data_off + count > self.nbytes else (data_off, count)

    def gather(
        self, buf: np.ndarray, positions: np.ndarray, pool: BufferPool | None = None
    ) -> np.ndarray | None:
        """The field of every sample as one ``(n, *shape)`` array (a fresh copy; long rows
        land in a block leased from ``pool`` when given, memory already faulted in).

        None when the ``.npy`` headers differ between samples, or do not match the declared
        dtype and shape.
        """
        if len(positions) == 0:
            return np.empty((0, *self.shape), dtype=self.dtype)
        first = int(positions[0])
        span = self.data_span(buf[first : first + self.nbytes])
        if span is None:
            return None
        data_off, count = span
        if count >= LARGE_ROW:
            return _copy_rows(buf, positions, data_off, count, self, pool)
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
        span = self.data_span(block[0, offset : offset + self.nbytes])
        if span is None:
            return None
        data_off, count = span
        headers = block[:, offset : offset + data_off]
        if not (headers == headers[0]).all():
            return None
        start = offset + data_off
        data = np.ascontiguousarray(block[:, start : start + count])
        return data.view(self.dtype).reshape(len(block), *self.shape)


def _copy_rows(
    buf: np.ndarray,
    positions: np.ndarray,
    data_off: int,
    count: int,
    table: FieldTable,
    pool: BufferPool | None,
) -> np.ndarray | None:
    """:meth:`FieldTable.gather` of long rows: each row copied once, straight into the batch
    array (a row is ``count >= LARGE_ROW`` bytes, so the loop costs nothing next to the copy);
    the ``.npy`` headers (``data_off`` bytes before each row) must match the first one."""
    if positions.min() < 0 or positions.max() + data_off + count > len(buf):
        return None
    size = len(positions) * count
    flat = np.empty(size, dtype=np.uint8) if pool is None else pool.lease(size)
    out = flat.reshape(len(positions), count)
    head = buf[int(positions[0]) : int(positions[0]) + data_off]
    for j, p in enumerate(positions.tolist()):
        if data_off and not np.array_equal(buf[p : p + data_off], head):
            return None
        out[j] = buf[p + data_off : p + data_off + count]
    return out.view(table.dtype).reshape(len(positions), *table.shape)


LARGE_ROW = 16 * 2**10  # rows at least this long are copied one by one (no fancy index)


def field_tables(
    schema: Mapping[str, FieldSpec],
    fields: Sequence[str],
    dims: Mapping[str, int],
    shards: Sequence[ShardInfo],
    raw: Sequence[str] = (),
    as_bytes: Sequence[str] = (),
) -> dict[str, FieldTable]:
    """A :class:`FieldTable` for each of ``fields`` that is a fixed-size ``.npy`` field, or
    one of ``raw`` (bytes fields decoded as uint8 vectors) or ``as_bytes`` (undeclared bytes
    fields) that the shards' layouts give one size."""
    out: dict[str, FieldTable] = {}
    for name in fields:
        spec = schema.get(name)
        if spec is not None and spec.optional:
            continue  # samples may lack it: found per sample
        if (name in raw or name in as_bytes) and spec is not None:
            table = FieldTable(spec, None, shards, raw=True, as_bytes=name in as_bytes)
            if table.nbytes >= 0:
                out[name] = table
            continue
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
