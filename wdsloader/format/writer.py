"""Writing ustar: member headers, and the streaming writer of one shard (sample offsets for the
index, sha256, layout).

Plain POSIX ustar, mode 0644, uid/gid 0, empty user/group names, mtime 0, one 512-byte header
per member (no PAX, no GNU extensions), names of at most 100 bytes. Archives end with two zero
blocks. The field layout is :mod:`wdsloader.format.ustar`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from wdsloader.format.deflate import COMPRESSIONS, ShardDeflater, deflate_bound
from wdsloader.format.index import encode_index
from wdsloader.format.keyindex import hash_records, key_hash, raw_key_hash
from wdsloader.format.keys import split_name, validate_key
from wdsloader.format.ustar import (
    BLOCK,
    CHECKSUM,
    DEVMAJOR,
    DEVMINOR,
    END_OF_ARCHIVE,
    GID,
    MAGIC,
    MAX_NAME_BYTES,
    MODE,
    MTIME,
    NAME,
    SIZE,
    TYPEFLAG,
    UID,
    VERSION,
    octal_field,
    padded,
)

# The constant part of every header we write (everything but name, size, checksum).
_HEADER_TEMPLATE = bytearray(BLOCK)
_HEADER_TEMPLATE[MODE] = octal_field(0o644, 8)
_HEADER_TEMPLATE[UID] = octal_field(0, 8)
_HEADER_TEMPLATE[GID] = octal_field(0, 8)
_HEADER_TEMPLATE[MTIME] = octal_field(0, 12)
_HEADER_TEMPLATE[TYPEFLAG] = b"0"
_HEADER_TEMPLATE[MAGIC] = b"ustar\0"
_HEADER_TEMPLATE[VERSION] = b"00"
_HEADER_TEMPLATE[DEVMAJOR] = octal_field(0, 8)
_HEADER_TEMPLATE[DEVMINOR] = octal_field(0, 8)
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
    header[SIZE] = octal_field(size, 12)
    return header, _TEMPLATE_SUM + sum(name) + sum(header[SIZE])


def encode_header(name: str, size: int) -> bytes:
    """A ustar header for a regular file ``name`` of ``size`` bytes."""
    header, checksum = header_template(member_name_bytes(name), size)
    header[CHECKSUM] = b"%06o\0 " % checksum
    return bytes(header)


def encode_member(name: str, data: bytes) -> bytes:
    """Header, data and padding of one member."""
    pad = padded(len(data)) - len(data)
    return encode_header(name, len(data)) + data + b"\0" * pad


_FRAME_CACHE_MAX = 256  # sample shapes kept per writer (one is the common case)

Shape = tuple[object, ...]  # (key length, (ext, size), (ext, size), ...)


@dataclass(slots=True, frozen=True)
class _Frame:
    """Every sample of one shape (key length, member extensions and sizes) as a bytes %-format.

    ``fmt`` is the sample's bytes with three holes per member: the key in its header name
    (``%s``), the header checksum (``%06o``) and the data (``%s``); ``checksums`` are the header
    checksums without the key's bytes. A sample is then one formatting operation in C.
    """

    fmt: bytes
    checksums: tuple[int, ...]
    layout: dict[str, list[int]]


def _literal(raw: bytes | bytearray) -> bytes:
    return bytes(raw).replace(b"%", b"%%")


def _build_frame(key: str, members: Sequence[tuple[str, bytes]]) -> _Frame:
    keylen = len(key.encode("utf-8"))
    blank = bytes(keylen)
    parts: list[bytes] = []
    checksums: list[int] = []
    layout: dict[str, list[int]] = {}
    pos = 0
    for ext, data in members:
        size = len(data)
        name = blank + member_name_bytes(f"{key}.{ext}")[keylen:]  # checks the real name's length
        header, checksum = header_template(name, size)
        parts += (
            b"%s",
            _literal(header[keylen : CHECKSUM.start]),
            b"%06o\0 ",
            _literal(header[CHECKSUM.stop :]),
            b"%s",
        )
        parts.append(bytes(padded(size) - size))
        checksums.append(checksum)
        layout[ext] = [pos + BLOCK, size]
        pos += BLOCK + padded(size)
    return _Frame(b"".join(parts), tuple(checksums), layout)


class TarStreamWriter:
    """Write samples to a binary file object and record what the index and manifest need.

    Each sample is ``(key, [(ext, data), ...])``; members are written in the given order, so the
    caller fixes the member order (the same in every sample). ``layout`` holds, for every
    extension whose data sits at the same offset from the sample start with the same size in
    every sample so far, ``[offset, size]``.

    A sample costs one %-formatting of its shape's template (headers are built once per shape),
    one ``write`` and one hash update.

    ``compression="gzip"`` writes a ``.tar.gz`` whose samples inflate one by one
    (:mod:`wdsloader.format.deflate`): ``offsets`` and ``offset`` are then compressed byte
    offsets, and ``layout`` stays None (fields cannot be gathered from compressed bytes).
    """

    def __init__(self, fileobj: BinaryIO, *, compression: str | None = None) -> None:
        if compression is not None and compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be None or one of {COMPRESSIONS}, got {compression!r}"
            )
        self._f = fileobj
        self._sha = hashlib.sha256()
        self.offset = 0
        self.offsets: list[int] = []
        self.key_hashes: list[int] = []  # each sample's key hash, for the key index
        self.layout: dict[str, list[int]] | None = None
        self.closed = False
        self.compression = compression
        self._frames: dict[Shape, _Frame] = {}
        self._last_frame: _Frame | None = None
        self._deflater: ShardDeflater | None = None
        if compression is not None:
            self._deflater = ShardDeflater()
            self._write(self._deflater.header())

    @property
    def num_samples(self) -> int:
        return len(self.offsets)

    def projected_size(self, members: Sequence[tuple[str, bytes]]) -> int:
        """File size after adding this sample and closing."""
        # a member takes its 512-byte header plus its data padded to 512 bytes
        blocks = sum([(len(data) + 2 * BLOCK - 1) // BLOCK for _, data in members])
        if self._deflater is not None:  # judged before compressing: an upper bound
            return self.offset + deflate_bound(blocks * BLOCK) + deflate_bound(len(END_OF_ARCHIVE))
        return self.offset + blocks * BLOCK + len(END_OF_ARCHIVE)

    def projected_raw_size(self, nbytes: int) -> int:
        """File size after adding a sample of ``nbytes`` tar bytes with :meth:`write_raw`."""
        if self._deflater is not None:
            return self.offset + deflate_bound(nbytes) + deflate_bound(len(END_OF_ARCHIVE))
        return self.offset + nbytes + len(END_OF_ARCHIVE)

    def write_raw(self, sample: bytes, layout: dict[str, list[int]] | None) -> None:
        """Append one sample's tar bytes as :meth:`write_sample` wrote them into another shard
        (to pack shards together); ``layout``: that shard's (None: it had none, so this shard
        gets none either)."""
        name = bytes(sample[: NAME.stop]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        parts = split_name(name)
        if parts is None:
            raise ValueError(f"a raw sample must start with a member KEY.EXT, got {name!r}")
        self.key_hashes.append(key_hash(parts[0]))
        self.offsets.append(self.offset)
        if self._deflater is not None:
            self._write(self._deflater.sample(sample))
            return
        self._write(sample)
        self._last_frame = None
        self._merge_layout(layout or {})

    def _write(self, data: bytes | bytearray) -> None:
        self._f.write(data)
        self._sha.update(data)
        self.offset += len(data)

    def _frame(self, key: str, raw_key: bytes, members: Sequence[tuple[str, bytes]]) -> _Frame:
        shape: Shape = (len(raw_key), *[(ext, len(data)) for ext, data in members])
        frame = self._frames.get(shape)
        if frame is None:
            if len(self._frames) >= _FRAME_CACHE_MAX:
                self._frames.clear()
            frame = self._frames[shape] = _build_frame(key, members)
        return frame

    def write_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        validate_key(key)
        if not members:
            raise ValueError(f"sample {key!r} has no fields")
        raw_key = key.encode("utf-8")
        frame = self._frame(key, raw_key, members)
        keysum = sum(raw_key)
        args: list[object] = []
        for checksum, (_, data) in zip(frame.checksums, members, strict=True):
            args += (raw_key, checksum + keysum, data)
        sample = frame.fmt % tuple(args)
        self.key_hashes.append(raw_key_hash(raw_key))
        self.offsets.append(self.offset)
        if self._deflater is not None:
            self._write(self._deflater.sample(sample))
            return
        self._write(sample)
        if frame is not self._last_frame:
            self._last_frame = frame
            self._merge_layout(frame.layout)

    def _merge_layout(self, layout: dict[str, list[int]]) -> None:
        if self.layout is None:
            self.layout = {ext: list(span) for ext, span in layout.items()}
        else:
            self.layout = {k: v for k, v in self.layout.items() if layout.get(k) == v}

    def close(self) -> tuple[bytes, str]:
        """Write the end-of-archive blocks; returns ``(index_bytes, sha256_hex)``."""
        end = self.offset
        if self._deflater is not None:
            self._write(self._deflater.finish(END_OF_ARCHIVE))
        else:
            self._write(END_OF_ARCHIVE)
        self.closed = True
        return encode_index([*self.offsets, end]), self._sha.hexdigest()

    def key_index(self) -> bytes:
        """The bytes of this shard's key index (:mod:`wdsloader.format.keyindex`)."""
        return hash_records(self.key_hashes).tobytes()
