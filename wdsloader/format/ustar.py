"""The ustar layout and its parsing: named header fields, scalar and whole-batch header checks
(the byte-level part of the format contract).

A header is 512 bytes; its fields are the ``slice`` constants below (``header[SIZE]``), for a
single header (bytes) and for a ``(n, 512)`` uint8 array of headers (``headers[:, SIZE]``)
alike. Nothing outside this module indexes header bytes by number.

:func:`plain_member` is the fast check of one plain header; :func:`checksums_ok`,
:func:`header_sizes` and :func:`plain_regular` check a batch of headers at once. The walk over
the members of a buffer lives in :mod:`wdsloader.format.members`, writing in
:mod:`wdsloader.format.writer`."""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

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
    return octal_sizes(headers[:, SIZE])


def octal_sizes(field: Headers) -> npt.NDArray[np.int64] | None:
    """The sizes in ``(n, 12)`` size fields (:func:`header_sizes`), or None unless all are
    11 octal digits and a NUL or space."""
    digits = field[:, :-1] - np.uint8(48)  # wraps below "0": above 7 too
    if (digits > 7).any() or not ((field[:, -1] == 0) | (field[:, -1] == 32)).all():
        return None
    sizes: npt.NDArray[np.int64] = digits.astype(np.int64) @ _OCTAL
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
