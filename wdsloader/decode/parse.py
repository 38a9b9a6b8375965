"""The row parser: the members of one sample's byte range.

:func:`parse_sample` turns the byte range of one sample (as the shard's index gives it) into
``(key, {ext: memoryview})``.
"""

from __future__ import annotations

from wdsloader.decode.codecs import Buffer
from wdsloader.errors import ShardFormatError
from wdsloader.format.keys import split_name
from wdsloader.format.members import iter_members
from wdsloader.format.ustar import BLOCK, plain_member


class _NotPlain(Exception):
    """A header the fast path does not handle (PAX, GNU, prefix, links, end marker...)."""


def parse_sample(
    buf: Buffer,
    start: int = 0,
    end: int | None = None,
    *,
    base_offset: int = 0,
    source: str = "<shard>",
) -> tuple[str, dict[str, memoryview]]:
    """The members of the one sample lying in ``buf[start:end]``: ``(key, {ext: data})``.

    Extensions are lower-cased (the WebDataset rule of :func:`wdsloader.format.split_name`);
    members webdataset skips (no dot, ``__meta__``-style names) are skipped. The data are
    memoryviews into ``buf`` (no copy). Byte offsets in errors are ``base_offset`` plus the
    position in ``buf``. Raises :class:`ShardFormatError` naming ``source``, the byte offset and
    the key when the range holds no member, members of two keys, an extension twice, a corrupt
    header or data running past the range.

    Plain ustar headers (what our writer and most tools write for short ASCII names) take a fast
    path; anything else (PAX or GNU extension headers, a ``prefix`` field, links, a bad checksum)
    is re-parsed with :func:`wdsloader.format.iter_members`, which also produces the errors.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    stop = len(view) if end is None else end
    if stop > len(view):
        raise ShardFormatError(
            f"{source} at byte {base_offset + start}: sample range ends at byte "
            f"{base_offset + stop} but only {len(view)} bytes were read (truncated shard?)"
        )
    try:
        return _parse_plain(buf, view, start, stop, base_offset, source)
    except _NotPlain:
        return _parse_general(view, start, stop, base_offset, source)


def _parse_plain(
    buf: Buffer, view: memoryview, start: int, stop: int, base_offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    """Fast path over plain ustar headers; raises :class:`_NotPlain` on anything else."""
    key: str | None = None
    out: dict[str, memoryview] = {}
    src = buf if isinstance(buf, bytes) else None
    pos = start
    while pos + BLOCK <= stop:
        hdr = src[pos : pos + BLOCK] if src is not None else bytes(view[pos : pos + BLOCK])
        plain = plain_member(hdr)
        if plain is None:
            raise _NotPlain
        name, size = plain
        data_pos = pos + BLOCK
        if data_pos + size > stop:
            raise _NotPlain  # the general path words the error
        parts = split_name(name)
        if parts is not None:
            mkey, ext = parts
            if key is None:
                key = mkey
            if mkey != key or ext in out:
                _member_error(key, mkey, ext, name, base_offset + pos, source)
            out[ext] = view[data_pos : data_pos + size]
        pos = data_pos + (size + BLOCK - 1) // BLOCK * BLOCK
    if pos < stop:
        raise _NotPlain
    return _finish(key, out, base_offset + start, source)


def _parse_general(
    view: memoryview, start: int, stop: int, base_offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    """Any tar flavour, through :func:`iter_members`."""
    key: str | None = None
    out: dict[str, memoryview] = {}
    for member in iter_members(view, start, stop, base_offset=base_offset, source=source):
        data_pos = member.data_offset - base_offset
        if data_pos + member.size > stop:
            raise ShardFormatError(
                f"{source} at byte {member.header_offset}: data of member {member.name!r} "
                f"({member.size} bytes) runs past the end of the sample range at byte "
                f"{base_offset + stop} (stale or wrong shard index?)"
            )
        parts = split_name(member.name)
        if parts is not None:
            mkey, ext = parts
            if key is None:
                key = mkey
            if mkey != key or ext in out:
                _member_error(key, mkey, ext, member.name, member.header_offset, source)
            out[ext] = view[data_pos : data_pos + member.size]
    return _finish(key, out, base_offset + start, source)


def _member_error(key: str, mkey: str, ext: str, name: str, offset: int, source: str) -> None:
    """Raise the error for a member of another key, or a repeated extension."""
    if mkey != key:
        raise ShardFormatError(
            f"{source} at byte {offset}: member {name!r} belongs to sample {mkey!r}, but this "
            f"range holds sample {key!r} (stale or wrong shard index?)"
        )
    raise ShardFormatError(
        f"{source} at byte {offset}: sample {key!r} has the extension {ext!r} twice"
    )


def _finish(
    key: str | None, out: dict[str, memoryview], offset: int, source: str
) -> tuple[str, dict[str, memoryview]]:
    if key is None:
        raise ShardFormatError(
            f"{source} at byte {offset}: no sample member (KEY.EXT) in this range "
            "(stale or wrong shard index?)"
        )
    return key, out
