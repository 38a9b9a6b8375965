"""The data of the extension headers other writers put before a member: PAX extended headers
(records ``LENGTH KEY=VALUE\\n``; webdataset's ``ShardWriter`` writes one holding the float
``mtime`` before every member) and GNU long names.

Only the records that change what a reader sees are kept (``path`` and ``size``, and whether
``GNU.sparse.*`` records mark a sparse member); every record is still checked, so a malformed
one is refused wherever it stands.
"""

from __future__ import annotations

from wdsloader.errors import ShardFormatError

_NEWLINE, _EQUALS = 0x0A, b"="
_MAX_DIGITS = 20  # the space after a record's length lies within this many bytes of its start
_SPARSE = b"GNU.sparse."  # the records of a sparse member (PAX formats 0.0, 0.1 and 1.0)


def pax_path_size(
    data: bytes, source: str, at: int
) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The raw values of the ``path`` and ``size`` records of a PAX extended header's data
    (the last record of a key wins; None where there is none), and ``sparse``: None, or where a
    ``GNU.sparse.*`` record marks the member as sparse (GNU tar ``-S``, bsdtar; its data are
    then a map and the compacted extents), the value of ``GNU.sparse.name`` (``b""`` without).

    Raises :class:`ShardFormatError` naming ``source`` and ``at`` (the header's byte offset)
    for a record whose length does not frame ``LENGTH KEY=VALUE\\n`` or whose key is not
    UTF-8. NUL padding after the records is allowed.
    """
    path = size = sparse = None
    pos, end = 0, len(data)
    while pos < end:
        space = data.find(b" ", pos, pos + _MAX_DIGITS)
        digits = data[pos:space]
        length = int(digits) if space > pos and digits.isdigit() else -1
        stop = pos + length
        if length < 0 or length < space - pos + 3 or stop > end or data[stop - 1] != _NEWLINE:
            if data[pos] == 0 and not data[pos:].strip(b"\0"):  # NUL padding after the records
                break
            raise _malformed(
                source,
                at,
                pos,
                f"length {(digits if space > pos else b'')[:20]!r}"
                " does not frame a 'LENGTH KEY=VALUE\\n' record",
            )
        eq = data.find(_EQUALS, space + 1, stop - 1)
        key = data[space + 1 : eq]
        if eq <= space + 1 or not (key.isascii() or _is_utf8(key)):
            raise _malformed(source, at, pos, f"{data[pos:stop][:60]!r} has no UTF-8 'KEY='")
        if key == b"path":
            path = data[eq + 1 : stop - 1]
        elif key == b"size":
            size = data[eq + 1 : stop - 1]
        elif key[:11] == _SPARSE:
            if key == b"GNU.sparse.name":
                sparse = data[eq + 1 : stop - 1]
            elif sparse is None:
                sparse = b""
        pos = stop
    return path, size, sparse


def _malformed(source: str, at: int, pos: int, why: str) -> ShardFormatError:
    return ShardFormatError(
        f"{source} at byte {at}: malformed PAX record at byte {pos} of the extended header: {why}"
    )


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def pax_size(raw: bytes, where: object) -> int:
    """The byte count of a PAX ``size`` record's value (ASCII digits only)."""
    if not raw.isdigit():  # bytes.isdigit: ASCII digits only, False when empty
        value = raw.decode("utf-8", "surrogateescape")
        raise ShardFormatError(f"{where}: PAX size {value[:40]!r} is not a byte count")
    return int(raw)


def pax_text(raw: bytes) -> str:
    """A PAX record's value as text (UTF-8, undecodable bytes kept as escapes)."""
    return raw.decode("utf-8", "surrogateescape")


def gnu_long_name(data: bytes, where: object) -> str:
    """The name a GNU long-name (``L``) header's data holds: up to its first NUL."""
    name = data.split(b"\0", 1)[0]
    if not name:
        raise ShardFormatError(f"{where}: empty GNU long name")
    return name.decode("utf-8", "surrogateescape")
