"""Minimal ustar writing and fast tar member parsing (the byte-level part of the format contract).

Writing: plain POSIX ustar, mode 0644, uid/gid 0, empty user/group names, mtime 0, one 512-byte
header per member (no PAX, no GNU extensions), names of at most 100 bytes. Archives end with two
zero blocks.

Reading: :func:`iter_members` walks raw headers in a buffer. It understands the headers other
writers add (PAX ``x``/``g``, GNU ``L`` long names, ustar ``prefix``) so shards written by
webdataset, Python's ``tarfile`` or GNU tar parse too; non-regular members are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from wdsloader.errors import ShardFormatError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MAX_NAME_BYTES = 100

_REGULAR = (b"0", b"\0", b"7")


def padded(nbytes: int) -> int:
    """Bytes ``nbytes`` of data occupy in a tar, padding included."""
    return (nbytes + BLOCK - 1) // BLOCK * BLOCK


def member_size(nbytes: int) -> int:
    """Bytes one member with ``nbytes`` of data occupies: header plus padded data."""
    return BLOCK + padded(nbytes)


def _octal(value: int, width: int) -> bytes:
    """NUL-terminated zero-padded octal field of ``width`` bytes."""
    text = b"%0*o" % (width - 1, value)
    if len(text) != width - 1:
        raise ValueError(f"value {value} does not fit a {width}-byte tar field")
    return text + b"\0"


# The constant part of every header we write (everything but name, size, checksum).
_HEADER_TEMPLATE = bytearray(BLOCK)
_HEADER_TEMPLATE[100:108] = _octal(0o644, 8)
_HEADER_TEMPLATE[108:116] = _octal(0, 8)
_HEADER_TEMPLATE[116:124] = _octal(0, 8)
_HEADER_TEMPLATE[136:148] = _octal(0, 12)
_HEADER_TEMPLATE[156:157] = b"0"
_HEADER_TEMPLATE[257:263] = b"ustar\0"
_HEADER_TEMPLATE[263:265] = b"00"
_HEADER_TEMPLATE[329:337] = _octal(0, 8)
_HEADER_TEMPLATE[337:345] = _octal(0, 8)
_TEMPLATE_SUM = sum(_HEADER_TEMPLATE) + 8 * 32  # checksum field counts as spaces


def member_name_bytes(name: str) -> bytes:
    """``name`` as UTF-8, or a ValueError unless it is 1 to 100 bytes long."""
    raw = name.encode("utf-8")
    if not raw or len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"tar member name must be 1..{MAX_NAME_BYTES} bytes, got {name!r}")
    return raw


def header_template(name: bytes, size: int) -> tuple[bytearray, int]:
    """A ustar header for the raw ``name`` and ``size`` with its checksum field left to fill,
    and the checksum of that header.

    ``name`` may hold NUL bytes as placeholders (they add nothing to the checksum): writing
    bytes over them later adds their sum to the checksum. :class:`TarStreamWriter` builds one
    template per sample shape this way and drops each key in.
    """
    header = bytearray(_HEADER_TEMPLATE)
    header[0 : len(name)] = name
    header[124:136] = _octal(size, 12)
    return header, _TEMPLATE_SUM + sum(name) + sum(header[124:136])


def encode_header(name: str, size: int) -> bytes:
    """A ustar header for a regular file ``name`` of ``size`` bytes."""
    header, checksum = header_template(member_name_bytes(name), size)
    header[148:156] = b"%06o\0 " % checksum
    return bytes(header)


def encode_member(name: str, data: bytes) -> bytes:
    """Header, data and padding of one member."""
    pad = padded(len(data)) - len(data)
    return encode_header(name, len(data)) + data + b"\0" * pad


@dataclass(slots=True, frozen=True)
class Member:
    """One regular member found in a buffer: its name and where its data lies.

    ``header_offset`` is where the member's first header starts, extension headers (PAX, GNU
    long name) included, so a sample's byte range taken from it holds all of its headers.
    """

    name: str
    header_offset: int
    data_offset: int
    size: int


def _field_str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_size(field: bytes, where: str) -> int:
    if field[0] & 0x80:  # GNU base-256 encoding for large sizes
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardFormatError(f"{where}: bad size field {field!r}") from None


def _checksum_ok(header: memoryview) -> bool:
    stored = bytes(header[148:156]).split(b"\0", 1)[0].strip()
    try:
        expected = int(stored, 8)
    except ValueError:
        return False
    total = sum(header[:148]) + 256 + sum(header[156:])
    return total == expected


def _parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def iter_members(
    buf: bytes | bytearray | memoryview,
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
    header or data that runs past the buffer.
    """
    view = memoryview(buf)
    stop = len(view) if end is None else end
    pos = start
    long_name: str | None = None
    pax: dict[str, str] = {}
    first_header: int | None = None  # start of the extension headers of the next member
    while pos + BLOCK <= stop:
        header = view[pos : pos + BLOCK]
        if header[0] == 0 and not any(header):
            return
        where = f"{source} at byte {base_offset + pos}"
        if not _checksum_ok(header):
            raise ShardFormatError(f"{where}: corrupt tar header (checksum mismatch)")
        size = _parse_size(bytes(header[124:136]), where)
        typeflag = bytes(header[156:157])
        data_offset = pos + BLOCK
        next_pos = data_offset + padded(size)
        if data_offset + size > len(view):
            raise ShardFormatError(
                f"{where}: member data ({size} bytes) runs past the end of the data "
                f"(truncated shard?)"
            )
        if typeflag in _REGULAR:
            if "path" in pax:
                name = pax["path"]
            elif long_name is not None:
                name = long_name
            else:
                name = _field_str(bytes(header[0:100]))
                if bytes(header[257:262]) == b"ustar":
                    prefix = _field_str(bytes(header[345:500]))
                    if prefix:
                        name = prefix + "/" + name
            if "size" in pax:
                size = int(pax["size"])
                next_pos = data_offset + padded(size)
            start_offset = pos if first_header is None else first_header
            yield Member(name, base_offset + start_offset, base_offset + data_offset, size)
            long_name, pax, first_header = None, {}, None
        elif typeflag == b"L":
            long_name = bytes(view[data_offset : data_offset + size]).rstrip(b"\0").decode()
            first_header = pos if first_header is None else first_header
        elif typeflag == b"x":
            pax = _parse_pax(bytes(view[data_offset : data_offset + size]))
            first_header = pos if first_header is None else first_header
        else:  # links, devices, directories, fifos, global PAX headers: skipped
            long_name, pax, first_header = None, {}, None
        pos = next_pos
    if pos < stop:
        raise ShardFormatError(f"{source} at byte {base_offset + pos}: truncated tar header")
