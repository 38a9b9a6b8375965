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


MAX_EXTENSION_BYTES = 1 << 20
"""Data of one PAX or GNU long-name header larger than this is refused as malformed."""

_OCTAL_DIGITS = b"01234567"


def parse_octal(field: bytes | bytearray | memoryview) -> int | None:
    """The value of a ustar numeric field, or None when it is malformed.

    Octal digits, optionally led by spaces and ended by a NUL or spaces (an empty field is 0),
    or GNU base-256 with a leading 0x80 byte. Signs, other characters and negative base-256
    values are malformed.
    """
    raw = bytes(field)
    if raw[:1] == b"\x80":
        return int.from_bytes(raw[1:], "big")
    text = raw.split(b"\0", 1)[0].strip(b" ")
    if text.translate(None, _OCTAL_DIGITS):
        return None
    return int(text, 8) if text else 0


def checksum_ok(header: bytes | bytearray | memoryview) -> bool:
    """Whether a 512-byte header's checksum field matches its bytes (the sum with the field
    itself counted as spaces; the signed-byte sum of old writers is accepted too)."""
    stored = parse_octal(header[148:156])
    if stored is None:
        return False
    raw = bytes(header)
    total = sum(raw) - sum(raw[148:156]) + 256
    if total == stored:
        return True
    high = sum(1 for b in raw[:148] + raw[156:] if b & 0x80)
    return total - 256 * high == stored


def _parse_pax(data: bytes, where: str) -> dict[str, str]:
    """The records ``LENGTH KEY=VALUE\\n`` of a PAX extended header's data."""
    records: dict[str, str] = {}
    pos, end = 0, len(data)
    while pos < end:
        if data[pos] == 0 and not data[pos:].strip(b"\0"):  # NUL padding after the records
            break
        space = data.find(b" ", pos, pos + 20)
        digits = data[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else -1
        stop = pos + length
        if length < space - pos + 3 or stop > end or data[stop - 1] != 0x0A:
            raise ShardFormatError(
                f"{where}: malformed PAX record at byte {pos} of the extended header: "
                f"length {digits[:20]!r} does not frame a 'LENGTH KEY=VALUE\\n' record"
            )
        key, eq, value = data[space + 1 : stop - 1].partition(b"=")
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            name = ""
        if not eq or not name:
            raise ShardFormatError(
                f"{where}: malformed PAX record at byte {pos} of the extended header: "
                f"{data[pos:stop][:60]!r} has no UTF-8 'KEY='"
            )
        records[name] = value.decode("utf-8", "surrogateescape")
        pos = stop
    return records


def _pax_size(pax: dict[str, str], where: str) -> int | None:
    value = pax.get("size")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise ShardFormatError(f"{where}: PAX size {value[:40]!r} is not a byte count")
    return int(value)


def _extension_data(view: memoryview, data_offset: int, size: int, stop: int, where: str) -> bytes:
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


def _long_name(data: bytes, where: str) -> str:
    name = data.split(b"\0", 1)[0]
    if not name:
        raise ShardFormatError(f"{where}: empty GNU long name")
    return name.decode("utf-8", "surrogateescape")


def _member_name(header: memoryview, pax: dict[str, str], long_name: str | None) -> str:
    if "path" in pax:
        return pax["path"]
    if long_name is not None:
        return long_name
    name = _field_str(bytes(header[0:100]))
    if bytes(header[257:262]) == b"ustar":
        prefix = _field_str(bytes(header[345:500]))
        if prefix:
            name = prefix + "/" + name
    return name


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
    header (checksum, size field, PAX record, GNU long name), a truncated header, or data that
    runs past the buffer (extension headers: past ``end``). Every step moves forward by at
    least one block, so any input ends in time linear in its length.
    """
    view = memoryview(buf)
    limit = len(view) if end is None else end
    stop = min(limit, len(view))
    pos = start
    long_name: str | None = None
    pax: dict[str, str] = {}
    first_header: int | None = None  # start of the extension headers of the next member
    while pos + BLOCK <= stop:
        header = view[pos : pos + BLOCK]
        if header[0] == 0 and not any(header):
            return
        where = f"{source} at byte {base_offset + pos}"
        if not checksum_ok(header):
            raise ShardFormatError(f"{where}: corrupt tar header (checksum mismatch)")
        size = parse_octal(header[124:136])
        if size is None:
            raise ShardFormatError(f"{where}: bad size field {bytes(header[124:136])!r}")
        typeflag = bytes(header[156:157])
        data_offset = pos + BLOCK
        if typeflag in _REGULAR:
            # a PAX size overrides the header's; errors name the chain's first header
            chain = (
                where if first_header is None else f"{source} at byte {base_offset + first_header}"
            )
            size = _pax_size(pax, chain) if "size" in pax else size
            if data_offset + size > len(view):
                what = "PAX size" if "size" in pax else "member data"
                raise ShardFormatError(
                    f"{chain}: {what} ({size} bytes) runs past the end of the data "
                    f"(truncated shard?)"
                )
            name = _member_name(header, pax, long_name)
            start_offset = pos if first_header is None else first_header
            yield Member(name, base_offset + start_offset, base_offset + data_offset, size)
            long_name, pax, first_header = None, {}, None
        elif typeflag == b"L":
            long_name = _long_name(_extension_data(view, data_offset, size, stop, where), where)
            first_header = pos if first_header is None else first_header
        elif typeflag == b"x":
            pax = _parse_pax(_extension_data(view, data_offset, size, stop, where), where)
            first_header = pos if first_header is None else first_header
        else:  # links, devices, directories, fifos, global PAX headers: skipped
            if data_offset + size > len(view):
                raise ShardFormatError(
                    f"{where}: member data ({size} bytes) runs past the end of the data "
                    f"(truncated shard?)"
                )
            long_name, pax, first_header = None, {}, None
        pos = data_offset + padded(size)
    if pos < limit:
        raise ShardFormatError(f"{source} at byte {base_offset + pos}: truncated tar header")
