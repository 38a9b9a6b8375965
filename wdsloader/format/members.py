"""The walk over the members of a tar held in a buffer: :func:`iter_members`.

It understands the headers other writers add (PAX ``x``/``g``, GNU ``L`` long names, ustar
``prefix``) so shards written by webdataset, Python's ``tarfile`` or GNU tar parse too (the
records themselves: :mod:`wdsloader.format.pax`); directories, devices and other non-regular
members are skipped. Headers in the usual form take an exact fast path; any other form goes
through the general checks (:mod:`wdsloader.format.ustar`), with the same result.
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from wdsloader.errors import ShardFormatError
from wdsloader.format.keys import split_name
from wdsloader.format.pax import gnu_long_name, pax_path_size, pax_size, pax_text
from wdsloader.format.ustar import (
    BLOCK,
    CHECKSUM,
    LINKNAME,
    MAGIC,
    MAX_EXTENSION_BYTES,
    NAME,
    PREFIX,
    SIZE,
    TYPEFLAG,
    USTAR_MAGIC,
    checksum_ok,
    field_text,
    parse_octal,
)

_TYPE_AT = TYPEFLAG.start
_PREFIX_AT = PREFIX.start
_MAGIC5 = slice(MAGIC.start, MAGIC.start + len(USTAR_MAGIC))
_OCTAL_DIGITS = b"01234567"
_GZIP_MAGIC = b"\x1f\x8b"


class _Where:
    """``"SOURCE at byte N"``, formatted only when an error message needs it."""

    __slots__ = ("offset", "source")

    def __init__(self, source: str, offset: int) -> None:
        self.source = source
        self.offset = offset

    def __str__(self) -> str:
        return f"{self.source} at byte {self.offset}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Member(NamedTuple):
    """One regular member found in a buffer: its name and where its data lies.

    ``header_offset`` is where the member's first header starts, extension headers (PAX, GNU
    long name) included, so a sample's byte range taken from it holds all of its headers.
    """

    name: str
    header_offset: int
    data_offset: int
    size: int


def _sliceable(buf: object, view: memoryview) -> bytes | mmap.mmap | None:
    """The object whose slices are the bytes of ``view`` (bytes or an mmap), else None."""
    obj = buf.obj if type(buf) is memoryview else buf
    if type(obj) is not bytes and type(obj) is not mmap.mmap:
        return None
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous or view.nbytes != len(obj):
        return None  # a part of obj, or a cast view
    return obj


def _gzip_data(where: str) -> ShardFormatError:
    return ShardFormatError(
        f"{where}: gzip data (magic bytes 1f 8b), not a tar header: a gzip-compressed tar "
        "named .tar? decompress it first (gzip -dc)"
    )


def _truncated(head: bytes, where: str) -> ShardFormatError:
    """The error for less than a header's bytes left (``head``: their first two)."""
    return (
        _gzip_data(where)
        if head == _GZIP_MAGIC
        else ShardFormatError(f"{where}: truncated tar header")
    )


def _checked_size(header: bytes, source: str, at: int) -> int:
    """The size field of a header in any form, after the checksum; -1 at the end-of-archive
    marker. Raises :class:`ShardFormatError` on a bad checksum or size field."""
    if header[0] == 0 and not header.strip(b"\0"):
        return -1
    if not checksum_ok(header):
        if header[:2] == _GZIP_MAGIC:
            raise _gzip_data(f"{source} at byte {at}")
        raise ShardFormatError(f"{source} at byte {at}: corrupt tar header (checksum mismatch)")
    size = parse_octal(header[SIZE])
    if size is None:
        raise ShardFormatError(f"{source} at byte {at}: bad size field {header[SIZE]!r}")
    return size


# The fast path of the walk reads the checksum and size fields in the form our writer, tarfile
# and GNU tar give them, through two small memos (a shard repeats few distinct fields).
_MEMO_MAX = 4096
_USUAL_SIZES: dict[bytes, int] = {}
_USUAL_SUMS: dict[bytes, int] = {}


def _usual_size(field: bytes) -> int:
    """The value of a 12-byte size field of 11 octal digits and a NUL, else -1 (memoised)."""
    digits = field[:11]
    size = int(digits, 8) if field[11] == 0 and not digits.translate(None, _OCTAL_DIGITS) else -1
    if len(_USUAL_SIZES) >= _MEMO_MAX:
        _USUAL_SIZES.clear()
    _USUAL_SIZES[field] = size
    return size


def _usual_sum(field: bytes) -> int:
    """For a checksum field of six octal digits, a NUL and a space: the low half of the Adler-32
    of an ASCII header with this field whose checksum holds, else -1 (memoised).

    An ASCII header sums to at most 127 * 512 < 65521, so Adler-32's low half is exactly 1 plus
    its byte sum, which is the checksum less 256 (the field counted as spaces) plus the field.
    """
    digits = field[:6]
    usual = field[6:] == b"\0 " and not digits.translate(None, _OCTAL_DIGITS)
    want = int(digits, 8) - 256 + sum(field) + 1 if usual else -1
    if len(_USUAL_SUMS) >= _MEMO_MAX:
        _USUAL_SUMS.clear()
    _USUAL_SUMS[field] = want
    return want


def _extension_data(
    view: memoryview, data_offset: int, size: int, stop: int, where: _Where
) -> bytes:
    """The data of a PAX or GNU long-name header, which must lie before ``stop``."""
    if data_offset + size > stop:
        raise ShardFormatError(
            f"{where}: extension header data ({size} bytes) runs past the end of the data"
        )
    if size > MAX_EXTENSION_BYTES:
        raise ShardFormatError(
            f"{where}: extension header of {size} bytes (more than {MAX_EXTENSION_BYTES})"
        )
    return bytes(view[data_offset : data_offset + size])


def _past_end(where: _Where, what: str, size: int) -> ShardFormatError:
    return ShardFormatError(
        f"{where}: {what} ({size} bytes) runs past the end of the data (truncated shard?)"
    )


def _plain_name(header: bytes) -> str:
    """The name a header holds itself (:func:`member_name`, for a header as bytes)."""
    nul = header.find(0, 0, NAME.stop)
    name = header[: nul if nul >= 0 else NAME.stop].decode("utf-8", "surrogateescape")
    if header[_PREFIX_AT] and header[_MAGIC5] == USTAR_MAGIC:
        return field_text(header[PREFIX]) + "/" + name
    return name


def _member_size(size: int, pax_raw: bytes | None, data_at: int, total: int, where: _Where) -> int:
    """A regular member's size: its PAX ``size`` record's when it has one, else its header's;
    refused when its data (from ``data_at``) would run past ``total``."""
    what = "member data" if pax_raw is None else "PAX size"
    size = size if pax_raw is None else pax_size(pax_raw, where)
    if data_at + size > total:
        raise _past_end(where, what, size)
    return size


def _chain_name(header: bytes, pax_path: bytes | None, long_name: str | None) -> str:
    """A member's name: its PAX ``path``, else its GNU long name, else its header's."""
    if pax_path is not None:
        return pax_text(pax_path)
    return long_name if long_name is not None else _plain_name(header)


def sparse_member_error(where: object, name: str) -> ShardFormatError:
    """The error for a sparse member (GNU typeflag ``S``, or PAX ``GNU.sparse.*`` records)."""
    return ShardFormatError(
        f"{where}: member {name!r} is written as a sparse member (GNU tar -S/--sparse, "
        "bsdtar): its data are a map of holes and the compacted extents, not the file; "
        "re-create the tar without --sparse (bsdtar: --no-read-sparse)"
    )


def _refuse_member(header: bytes, name: str, where: _Where) -> None:
    """Raise for a GNU sparse (``S``) member, and for a hard link or symlink that would be a
    sample member (``KEY.EXT``: readers skip links, so a field would vanish)."""
    flag = header[_TYPE_AT]
    if flag == 0x53:
        raise sparse_member_error(where, name)
    if split_name(name) is None:
        return
    kind = "a hard link" if flag == 0x31 else "a symlink"
    target = field_text(header[LINKNAME])
    raise ShardFormatError(
        f"{where}: member {name!r} is {kind} (to {target!r}); WebDataset samples need regular "
        "files (readers skip links, so the field would vanish): re-create the tar with the "
        "files themselves (GNU tar: --dereference --hard-dereference; bsdtar: -L)"
    )


_new_member = tuple.__new__  # Member(...) without the Python-level __new__ of a NamedTuple


def iter_members(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    start: int = 0,
    end: int | None = None,
    *,
    base_offset: int = 0,
    source: str = "<buffer>",
    refuse_links: bool = False,
) -> Iterator[Member]:
    """Regular members whose headers lie in ``buf[start:end]``, at ``base_offset`` plus their
    position in ``buf`` (a caller that read a byte range of a shard gets shard offsets).

    Stops at the end-of-archive marker or at ``end``. Raises :class:`ShardFormatError` naming
    ``source`` and the byte offset on a corrupt header (checksum, size field, PAX record, GNU
    long name), a truncated header, data that run past the buffer (extension headers: past
    ``end``), a sparse member and, with ``refuse_links``, a link named as a sample member.
    Every step moves forward by at least one block: linear time on any input.
    """
    view = memoryview(buf)
    total = len(view)
    src = _sliceable(buf, view)
    limit = total if end is None else end
    stop = min(limit, total)
    long_name: str | None = None
    pax_path: bytes | None = None
    pax_size_raw: bytes | None = None
    sparse: bytes | None = None  # from GNU.sparse.* PAX records: the member is sparse
    pos, first = start, -1  # first: where the next member's extension headers start; -1: none
    adler32, sizes, sums = zlib.adler32, _USUAL_SIZES, _USUAL_SUMS
    checksum_at, size_at, type_at = CHECKSUM, SIZE, _TYPE_AT
    while pos + BLOCK <= stop:
        header = src[pos : pos + BLOCK] if src is not None else view[pos : pos + BLOCK].tobytes()
        field, size_field = header[checksum_at], header[size_at]
        want = sums.get(field)
        if want is None:
            want = _usual_sum(field)
        size = sizes.get(size_field)
        if size is None:
            size = _usual_size(size_field)
        if want != adler32(header) & 0xFFFF or size < 0 or not header.isascii():
            size = _checked_size(header, source, base_offset + pos)  # any form, or an error
            if size < 0:
                return
        flag = header[type_at]
        data_offset = pos + BLOCK
        if flag == 0x30 or flag == 0 or flag == 0x37:  # a regular member
            if pax_size_raw is not None or data_offset + size > total:
                chain = _Where(source, base_offset + (pos if first < 0 else first))
                size = _member_size(size, pax_size_raw, data_offset, total, chain)
            plain = pax_path is None and long_name is None
            name = _plain_name(header) if plain else _chain_name(header, pax_path, long_name)
            at = base_offset + (pos if first < 0 else first)
            if sparse is not None:
                raise sparse_member_error(_Where(source, at), pax_text(sparse) or name)
            yield _new_member(Member, (name, at, base_offset + data_offset, size))
            long_name = pax_path = pax_size_raw = None
            first = -1
        elif flag == 0x78 or flag == 0x4C:  # "x": PAX records, "L": a GNU long name
            at = base_offset + pos
            if src is None or data_offset + size > stop or size > MAX_EXTENSION_BYTES:
                data = _extension_data(view, data_offset, size, stop, _Where(source, at))
            else:
                data = src[data_offset : data_offset + size]
            if flag == 0x78:
                pax_path, pax_size_raw, sparse = pax_path_size(data, source, at)
            else:
                long_name = gnu_long_name(data, _Where(source, at))
            first = pos if first < 0 else first
        else:  # links, devices, directories, fifos, global PAX headers: skipped
            if data_offset + size > total:
                raise _past_end(_Where(source, base_offset + pos), "member data", size)
            if flag == 0x53 or (refuse_links and (flag == 0x31 or flag == 0x32)):
                at = base_offset + (pos if first < 0 else first)
                _refuse_member(header, _chain_name(header, pax_path, long_name), _Where(source, at))
            long_name = pax_path = pax_size_raw = sparse = None
            first = -1
        pos = data_offset + (size + BLOCK - 1) // BLOCK * BLOCK
    if pos < limit:
        raise _truncated(view[pos : pos + 2].tobytes(), f"{source} at byte {base_offset + pos}")
