"""The member walk as it was before its fast path (wdsloader 2026-11-23, ``format/ustar.py``),
kept as the reference that tests/test_ustar_pax.py compares :func:`iter_members` with: on every
input both must yield the same members or raise the same error (class and message).

Changes since, made to both: a sparse member (GNU typeflag ``S``, PAX ``GNU.sparse.*`` records)
is refused (issue 20: its data are a map and compacted extents); a header that fails its
checksum and starts with the gzip magic bytes is reported as gzip data."""

# ruff: noqa: E501
from __future__ import annotations

from collections.abc import Iterator

from wdsloader.errors import ShardFormatError
from wdsloader.format.members import sparse_member_error
from wdsloader.format.ustar import (
    BLOCK,
    MAX_EXTENSION_BYTES,
    REGULAR_TYPES,
    SIZE,
    TYPEFLAG,
    checksum_ok,
    member_name,
    padded,
    parse_octal,
)


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


def _parse_pax(data: bytes, where: str | _Where) -> dict[str, str]:
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
        # the one change: "length < 0" (a record without a length used to step back a byte
        # when the value before it ended in a newline, then fail at an earlier byte)
        if length < 0 or length < space - pos + 3 or stop > end or data[stop - 1] != 0x0A:
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


def _pax_size(pax: dict[str, str], where: str | _Where) -> int:
    value = pax["size"]
    if not value.isascii() or not value.isdigit():
        raise ShardFormatError(f"{where}: PAX size {value[:40]!r} is not a byte count")
    return int(value)


def _extension_data(
    view: memoryview, data_offset: int, size: int, stop: int, where: str | _Where
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


def _long_name(data: bytes, where: str | _Where) -> str:
    name = data.split(b"\0", 1)[0]
    if not name:
        raise ShardFormatError(f"{where}: empty GNU long name")
    return name.decode("utf-8", "surrogateescape")


def _member_name(header: bytes | memoryview, pax: dict[str, str], long_name: str | None) -> str:
    if "path" in pax:
        return pax["path"]
    if long_name is not None:
        return long_name
    return member_name(header)


def reference_members(
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    base_offset: int = 0,
    source: str = "<buffer>",
) -> Iterator[tuple[str, int, int, int]]:
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
        header = bytes(view[pos : pos + BLOCK])
        if header[0] == 0 and not header.strip(b"\0"):
            return
        if not checksum_ok(header):
            at = f"{source} at byte {base_offset + pos}"
            if header.startswith(b"\x1f\x8b"):
                raise ShardFormatError(
                    f"{at}: gzip data (magic bytes 1f 8b), not a tar header: a gzip-compressed "
                    "tar named .tar? decompress it first (gzip -dc)"
                )
            raise ShardFormatError(f"{at}: corrupt tar header (checksum mismatch)")
        size = parse_octal(header[SIZE])
        if size is None:
            at = f"{source} at byte {base_offset + pos}"
            raise ShardFormatError(f"{at}: bad size field {header[SIZE]!r}")
        typeflag = header[TYPEFLAG]
        data_offset = pos + BLOCK
        where = _Where(source, base_offset + pos)
        if typeflag in REGULAR_TYPES:
            # a PAX size overrides the header's; errors name the chain's first header
            chain = where if first_header is None else _Where(source, base_offset + first_header)
            size = _pax_size(pax, chain) if "size" in pax else size
            if data_offset + size > len(view):
                what = "PAX size" if "size" in pax else "member data"
                raise ShardFormatError(
                    f"{chain}: {what} ({size} bytes) runs past the end of the data "
                    f"(truncated shard?)"
                )
            name = _member_name(header, pax, long_name)
            start_offset = pos if first_header is None else first_header
            if any(key.startswith("GNU.sparse.") for key in pax):
                real = pax.get("GNU.sparse.name") or name
                raise sparse_member_error(_Where(source, base_offset + start_offset), real)
            yield name, base_offset + start_offset, base_offset + data_offset, size
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
            if typeflag == b"S":
                chain = (
                    where if first_header is None else _Where(source, base_offset + first_header)
                )
                raise sparse_member_error(chain, _member_name(header, pax, long_name))
            long_name, pax, first_header = None, {}, None
        pos = data_offset + padded(size)
    if pos < limit:
        at = f"{source} at byte {base_offset + pos}"
        if bytes(view[pos : pos + 2]) == b"\x1f\x8b":
            raise ShardFormatError(
                f"{at}: gzip data (magic bytes 1f 8b), not a tar header: a gzip-compressed "
                "tar named .tar? decompress it first (gzip -dc)"
            )
        raise ShardFormatError(f"{at}: truncated tar header")
