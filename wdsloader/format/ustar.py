"""The ustar layout and its parsing: named header fields, scalar and whole-batch header checks,
and a walk over the members of a buffer (the byte-level part of the format contract).

A header is 512 bytes; its fields are the ``slice`` constants below (``header[SIZE]``), for a
single header (bytes) and for a ``(n, 512)`` uint8 array of headers (``headers[:, SIZE]``)
alike. Nothing outside this module indexes header bytes by number.

Reading: :func:`iter_members` walks raw headers in a buffer. It understands the headers other
writers add (PAX ``x``/``g``, GNU ``L`` long names, ustar ``prefix``) so shards written by
webdataset, Python's ``tarfile`` or GNU tar parse too (the records themselves:
:mod:`wdsloader.format.pax`); non-regular members are skipped. Headers in the usual form take
an exact fast path; any other form goes through the general checks, with the same result.
:func:`plain_member` is the fast check of one plain header; :func:`checksums_ok`,
:func:`header_sizes` and :func:`plain_regular` check a batch of headers at once. Writing lives
in :mod:`wdsloader.format.writer`.
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from wdsloader.errors import ShardFormatError
from wdsloader.format.pax import gnu_long_name, pax_path_size, pax_size, pax_text

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MAX_NAME_BYTES = 100

# The fields of a ustar header (POSIX.1-1988), as slices of its 512 bytes.
NAME = slice(0, 100)
MODE = slice(100, 108)
UID = slice(108, 116)
GID = slice(116, 124)
SIZE = slice(124, 136)
MTIME = slice(136, 148)
CHECKSUM = slice(148, 156)
TYPEFLAG = slice(156, 157)
LINKNAME = slice(157, 257)
MAGIC = slice(257, 263)
VERSION = slice(263, 265)
UNAME = slice(265, 297)
GNAME = slice(297, 329)
DEVMAJOR = slice(329, 337)
DEVMINOR = slice(337, 345)
PREFIX = slice(345, 500)

USTAR_MAGIC = b"ustar"
"""The first five bytes of ``MAGIC`` in POSIX ustar (``ustar\\0``) and GNU (``ustar ``) headers."""
REGULAR_TYPES = (b"0", b"\0", b"7")
"""Typeflags of a regular file (``7``: contiguous file, read as one)."""

_TYPE_AT = TYPEFLAG.start
_PREFIX_AT = PREFIX.start
_MAGIC5 = slice(MAGIC.start, MAGIC.start + len(USTAR_MAGIC))
_REGULAR_BYTES = frozenset(t[0] for t in REGULAR_TYPES)

Headers = npt.NDArray[np.uint8]
"""A ``(n, >= 512)`` uint8 array whose rows start with a tar header each."""


def padded(nbytes: int) -> int:
    """Bytes ``nbytes`` of data occupy in a tar, padding included."""
    return (nbytes + BLOCK - 1) // BLOCK * BLOCK


def octal_field(value: int, width: int) -> bytes:
    """The ``width``-byte numeric field holding ``value``: zero-padded octal and a NUL."""
    text = b"%0*o" % (width - 1, value)
    if len(text) != width - 1:
        raise ValueError(f"value {value} does not fit a {width}-byte tar field")
    return text + b"\0"


def field_text(raw: bytes) -> str:
    """A text field's value: up to its first NUL, UTF-8 (undecodable bytes kept as escapes)."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


MAX_EXTENSION_BYTES = 1 << 20
"""Data of one PAX or GNU long-name header larger than this is refused as malformed."""

_OCTAL_DIGITS = b"01234567"


def parse_octal(field: bytes | bytearray | memoryview) -> int | None:
    """The value of a ustar numeric field, or None when it is malformed.

    Octal digits, optionally led by spaces and ended by a NUL or spaces (an empty field is 0),
    or GNU base-256 with a leading 0x80 byte. Signs, other characters and negative base-256
    values are malformed.
    """
    raw = field if type(field) is bytes else bytes(field)
    if raw[:1] == b"\x80":
        return int.from_bytes(raw[1:], "big")
    nul = raw.find(0)
    text = (raw if nul < 0 else raw[:nul]).strip(b" ")
    if not text:
        return 0
    return None if text.translate(None, _OCTAL_DIGITS) else int(text, 8)


def checksum_ok(header: bytes | bytearray | memoryview) -> bool:
    """Whether a 512-byte header's checksum field matches its bytes (the sum with the field
    itself counted as spaces; the signed-byte sum of old writers is accepted too)."""
    stored = parse_octal(header[CHECKSUM])
    if stored is None:
        return False
    raw = bytes(header)
    total = byte_sum(raw) - sum(raw[CHECKSUM]) + 256
    if total == stored:
        return True
    # the signed sum: every byte >= 0x80 outside the checksum field counts 256 less
    high = len(raw.translate(None, _LOW_BYTES)) - len(raw[CHECKSUM].translate(None, _LOW_BYTES))
    return total - 256 * high == stored


_LOW_BYTES = bytes(range(0x80))


def byte_sum(raw: bytes) -> int:
    """The sum of the bytes of ``raw`` (a header: at most 512 bytes), in C.

    Adler-32's low half is ``1 + sum`` modulo 65521, and the bytes read as a little-endian
    integer are ``sum`` modulo 255 (256 is 1 modulo 255); 65521 * 255 exceeds the sum of 512
    bytes, so the two residues fix it (Chinese remainder): two C calls instead of a Python loop.
    """
    if len(raw) > BLOCK:
        return sum(raw)
    low = ((zlib.adler32(raw) & 0xFFFF) - 1) % _ADLER_MOD
    rest = int.from_bytes(raw, "little") % 255
    while low % 255 != rest:
        low += _ADLER_MOD
    return low


def member_name(header: bytes | bytearray | memoryview) -> str:
    """The member name a header holds itself: its name field, led by the ustar prefix."""
    name = field_text(bytes(header[NAME]))
    if bytes(header[_MAGIC5]) == USTAR_MAGIC:
        prefix = field_text(bytes(header[PREFIX]))
        if prefix:
            name = prefix + "/" + name
    return name


_STRIP = b"\0 "
_ADLER_MOD = 65521


def plain_member(hdr: bytes) -> tuple[str, int] | None:
    """``(name, size)`` of a plain header: a regular member without a ustar prefix, numeric
    fields of octal digits only, and a sound checksum; None for anything else (extension
    headers, links, other numeric forms, a bad checksum, the end marker), which
    :func:`iter_members` reads or refuses."""
    if hdr[_TYPE_AT] not in _REGULAR_BYTES or (hdr[_PREFIX_AT] and hdr[_MAGIC5] == USTAR_MAGIC):
        return None
    # octal digits only (no sign, "_" or inner blank: int() would take those)
    size_field, sum_field = hdr[SIZE].strip(_STRIP), hdr[CHECKSUM].strip(_STRIP)
    if not (size_field.isdigit() and sum_field.isdigit()):
        return None
    try:
        size = int(size_field, 8)
        checksum = int(sum_field, 8)
    except ValueError:  # the digits 8 and 9
        return None
    # The tar checksum is the byte sum with its own field counted as spaces. Adler-32's low
    # half is 1 + that sum modulo 65521, computed in C; a header sums to at most 130560, so
    # a corrupt header passes only if its sum moved by exactly 65521.
    actual = (zlib.adler32(hdr) & 0xFFFF) - 1 - sum(hdr[CHECKSUM]) + 256
    if (actual - checksum) % _ADLER_MOD:
        return None
    nul = hdr.find(b"\0", NAME.start, NAME.stop)
    name = hdr[NAME.start : nul if nul >= 0 else NAME.stop]
    return name.decode("utf-8", "surrogateescape"), size


# ---- whole batches of headers: (n, >= 512) uint8 arrays ----------------------------------------

_SHIFTS = np.array([15, 12, 9, 6, 3, 0], dtype=np.uint32)
_OCTAL = 8 ** np.arange(SIZE.stop - SIZE.start - 2, -1, -1, dtype=np.int64)


def _usual_checksums(headers: Headers) -> npt.NDArray[np.bool_]:
    """Per row: its checksum field holds, in the usual form (six octal digits and a NUL, as our
    writer, tarfile and GNU tar write it), the byte sum of the header with that field counted
    as spaces. False does not prove a header corrupt (other forms)."""
    h = headers[:, :BLOCK]
    field = h[:, CHECKSUM]
    total = h.sum(axis=1, dtype=np.uint32) - field.sum(axis=1, dtype=np.uint32) + 256
    digits = (total[:, None] >> _SHIFTS) & 7
    digits += 48
    ok: npt.NDArray[np.bool_] = (field[:, :6] == digits).all(axis=1) & (field[:, 6] == 0)
    return ok


def checksums_ok(headers: Headers) -> npt.NDArray[np.bool_]:
    """Per row of ``(n, >= 512)`` headers: whether its checksum holds, exactly as
    :func:`checksum_ok` decides (vectorised for the usual form of the field, the other rows
    one by one)."""
    ok = _usual_checksums(headers)
    if not ok.all():
        for j in np.flatnonzero(~ok).tolist():
            ok[j] = checksum_ok(headers[j, :BLOCK].tobytes())
    return ok


def header_sizes(headers: Headers) -> npt.NDArray[np.int64] | None:
    """The size fields of ``(n, >= 512)`` headers, when all are 11 octal digits and a NUL or
    space (what our writer and GNU tar write); else None."""
    field = headers[:, SIZE]
    digits = field[:, :-1].astype(np.int64) - 48
    if ((digits < 0) | (digits > 7)).any() or not (
        (field[:, -1] == 0) | (field[:, -1] == 32)
    ).all():
        return None
    sizes: npt.NDArray[np.int64] = digits @ _OCTAL
    return sizes


def typeflags(headers: Headers) -> npt.NDArray[np.uint8]:
    """The typeflag byte of each of ``(n, >= 512)`` headers."""
    return headers[:, _TYPE_AT]


def plain_regular(headers: Headers) -> bool:
    """Whether every one of ``(n, >= 512)`` headers is a regular member (typeflag ``0``, NUL or
    ``7``) with an empty prefix field (so its name is its name field)."""
    flags = headers[:, _TYPE_AT]
    regular = (flags == 0x30) | (flags == 0) | (flags == 0x37)
    return bool(regular.all()) and not bool((headers[:, _PREFIX_AT] != 0).any())


def name_fields(headers: Headers) -> Headers:
    """The ``(n, 100)`` name fields of ``(n, >= 512)`` headers (a view)."""
    return headers[:, NAME]


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


def _checked_size(header: bytes, source: str, at: int) -> int:
    """The size field of a header in any form, after the checksum; -1 at the end-of-archive
    marker. Raises :class:`ShardFormatError` on a bad checksum or size field."""
    if header[0] == 0 and not header.strip(b"\0"):
        return -1
    if not checksum_ok(header):
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


_new_member = tuple.__new__  # Member(...) without the Python-level __new__ of a NamedTuple


def iter_members(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    start: int = 0,
    end: int | None = None,
    *,
    base_offset: int = 0,
    source: str = "<buffer>",
) -> Iterator[Member]:
    """Regular members whose headers lie in ``buf[start:end]``.

    Offsets in the yielded members are ``base_offset`` plus the position in ``buf``, so a caller
    that read a byte range of a shard gets shard offsets. Stops at the end-of-archive marker or at
    ``end``. Raises :class:`ShardFormatError` naming ``source`` and the byte offset on a corrupt
    header (checksum, size field, PAX record, GNU long name), a truncated header, or data that
    runs past the buffer (extension headers: past ``end``). Every step moves forward by at
    least one block, so any input ends in time linear in its length.
    """
    view = memoryview(buf)
    total = len(view)
    src = _sliceable(buf, view)
    limit = total if end is None else end
    stop = min(limit, total)
    pos = start
    long_name: str | None = None
    pax_path: bytes | None = None
    pax_size_raw: bytes | None = None
    first = -1  # where the extension headers of the next member start; -1: none
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
                what = "member data" if pax_size_raw is None else "PAX size"
                size = size if pax_size_raw is None else pax_size(pax_size_raw, chain)
                if data_offset + size > total:
                    raise _past_end(chain, what, size)
            if pax_path is not None:
                name = pax_text(pax_path)
            else:
                name = long_name if long_name is not None else _plain_name(header)
            at = base_offset + (pos if first < 0 else first)
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
                pax_path, pax_size_raw = pax_path_size(data, source, at)
            else:
                long_name = gnu_long_name(data, _Where(source, at))
            first = pos if first < 0 else first
        else:  # links, devices, directories, fifos, global PAX headers: skipped
            if data_offset + size > total:
                raise _past_end(_Where(source, base_offset + pos), "member data", size)
            long_name = pax_path = pax_size_raw = None
            first = -1
        pos = data_offset + (size + BLOCK - 1) // BLOCK * BLOCK
    if pos < limit:
        raise ShardFormatError(f"{source} at byte {base_offset + pos}: truncated tar header")
