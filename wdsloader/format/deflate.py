"""Compressed shards (``compression: "gzip"``): a ``.tar.gz`` whose samples can be read one by one.

The shard is one gzip member (RFC 1952) holding the tar: a fixed 10-byte header (no name,
mtime 0, OS "unknown"), one deflate stream, the CRC-32 and size of the whole tar. The deflate
stream is cut with a *full flush* after every sample: the compressor empties its output to a
byte boundary (an empty stored block, the bytes ``00 00 ff ff``) and forgets what came before,
so the compressed bytes of each sample inflate on their own with a raw inflater. The
index (``.X.tar.gz.wdsidx``) holds those compressed offsets: sample ``i`` is the compressed bytes
``[idx[i], idx[i + 1])``; ``idx[n]`` is where the end-of-archive blocks start, compressed last
with the gzip trailer.

Every gzip and tar reader sees one ordinary ``.tar.gz`` (GNU tar, ``tarfile`` also in stream
mode as webdataset and Hugging Face ``datasets`` open tars, ``gzip -d``). A concatenation of
one gzip member per sample would be a valid gzip file too, but ``tarfile``'s stream mode
(``"r|*"``) reads only its first member, so those readers would silently see one sample.

A sample's bytes carry no checksum of their own (the file's sha256 in the manifest covers the
whole file, as for plain shards): :func:`inflate_sample` checks that the span is one whole
flushed piece of deflate data, and the tar parser then checks the headers.
"""

from __future__ import annotations

import struct
import zlib

from wdsloader.errors import ShardFormatError
from wdsloader.format.pax import pax_path_size, pax_size
from wdsloader.format.ustar import (
    BLOCK,
    MAX_EXTENSION_BYTES,
    SIZE,
    TYPEFLAG,
    checksum_ok,
    padded,
    parse_octal,
)

COMPRESSIONS = ("gzip",)
"""The values of a shard's ``compression`` in the manifest."""

GZIP_SUFFIX = ".gz"
GZIP_LEVEL = 6
"""The deflate level of gzip shards: zlib's and ``gzip``'s default. On the small records of
``bench/small_records.py`` (CPU per sample of the deflate step alone): grouped samples level 1
/ 6 / 9 compress to 0.169 / 0.159 / 0.154 of the tar bytes at 16 / 26 / 30 us; ungrouped
samples to 0.062 / 0.051 / 0.048 at 21 / 50 / 143 us. Level 6 is the cheapest that brings
ungrouped small records near 2x their JSONL (2.10x; level 1: 2.55x); level 9 saves 3-5% more
for 1.2-3x the CPU. Inflating costs 5-10 us per sample at every level."""

# magic, deflate, no flags, mtime 0, no extra flags, OS 255 ("unknown": the same bytes on
# every platform)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_FLUSH_MARK = b"\x00\x00\xff\xff"  # how a full flush ends: an empty stored block


class ShardDeflater:
    """Compresses the samples of one shard as they are written (see the module docstring).

    :meth:`header` is the file's first bytes, :meth:`sample` the compressed bytes of one
    sample (ending at a flush point), :meth:`finish` those of the end-of-archive blocks with
    the gzip trailer.
    """

    def __init__(self, level: int | None = None) -> None:
        level = GZIP_LEVEL if level is None else level
        self._z = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0

    @staticmethod
    def header() -> bytes:
        return GZIP_HEADER

    def sample(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        return self._z.compress(data) + self._z.flush(zlib.Z_FULL_FLUSH)

    def finish(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        body = self._z.compress(data) + self._z.flush(zlib.Z_FINISH)
        return body + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)


def deflate_bound(n: int) -> int:
    """At most the compressed bytes of ``n`` bytes of one sample (zlib's ``deflateBound`` with
    the flush marker): a shard's size bound holds before the sample is compressed."""
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + 2 * len(_FLUSH_MARK)


def inflate_sample(span: bytes | memoryview, where: str, max_length: int | None = None) -> bytes:
    """The tar bytes of one sample: :func:`inflate_pieces` joined."""
    return b"".join(inflate_pieces(span, where, max_length))


def inflate_pieces(
    span: bytes | memoryview, where: str, max_length: int | None = None
) -> list[bytes]:
    """The tar bytes (in pieces, to be joined) of one sample of one sample from its compressed bytes ``span`` (an index range of a
    gzip shard); :class:`ShardFormatError` starting with ``where`` (the shard and the sample)
    when the span is not one whole flushed piece of deflate data holding whole tar blocks.

    Inflation is incremental and follows the sample's tar headers: a header, then the data it
    declares (padded to 512 bytes), then the next header. Anything else in the span (a zero
    block or more data after the last member: a decompression bomb or a corrupt shard) is a
    :class:`ShardFormatError` as soon as its first 512 bytes are inflated, so memory stays
    bounded by the sizes the headers declare. With ``max_length``, a sample whose headers
    declare more than ``max_length`` bytes is refused before they are inflated: no more than
    ``max_length`` bytes are ever returned or held.
    """
    if len(span) < len(_FLUSH_MARK) or span[-len(_FLUSH_MARK) :] != _FLUSH_MARK:
        raise ShardFormatError(
            f"{where}: compressed sample does not end at a flush point (a corrupt shard, or an "
            "index that does not match it; is this a .tar.gz written by another tool?)"
        )
    stream = _Inflating(span, where, max_length)
    try:
        stream.walk()
    except zlib.error as exc:
        raise ShardFormatError(f"{where}: corrupt compressed data: {exc}") from None
    if stream.z.eof or stream.z.unused_data:
        raise ShardFormatError(
            f"{where}: the compressed stream ends inside the sample's range (corrupt data or "
            "an index that does not match the shard)"
        )
    if not stream.size or stream.size % BLOCK:
        raise ShardFormatError(
            f"{where}: inflated to {stream.size} bytes, not a whole number of 512-byte tar "
            "blocks (corrupt compressed data)"
        )
    return stream.out


_CHUNK = 1 << 16  # compressed bytes handed to zlib at a time
_EXTENSIONS = frozenset(b"xgLK")  # headers whose data describes the next member


class _Inflating:
    """One sample's raw deflate stream, inflated as its tar headers say (see
    :func:`inflate_pieces`): ``out`` holds the pieces inflated so far, ``size`` their bytes."""

    def __init__(self, span: bytes | memoryview, where: str, max_length: int | None) -> None:
        self.z = zlib.decompressobj(-zlib.MAX_WBITS)
        self.span = memoryview(span)
        self.pos = 0
        self.tail = b""
        self.where = where
        self.max_length = max_length
        self.out: list[bytes] = []
        self.size = 0

    def inflate(self, n: int) -> list[bytes]:
        """Up to ``n`` more inflated bytes (fewer only at the end of the span), appended to
        ``out`` and returned, in pieces; never more than ``max_length`` in all."""
        limit = self.max_length
        allowed = n if limit is None else min(n, limit - self.size)
        parts = self._inflate(allowed)
        if allowed < n and self.size == limit and self._inflate(1):
            raise ShardFormatError(
                f"{self.where}: the sample inflates to more than max_length={limit} bytes"
            )
        return parts

    def _inflate(self, n: int) -> list[bytes]:
        parts, need = [], n
        while need > 0 and not self.z.eof:
            data = self.tail or self.span[self.pos : self.pos + _CHUNK]
            if not self.tail:
                self.pos += len(data)
            chunk = self.z.decompress(data, need)
            self.tail = self.z.unconsumed_tail
            if chunk:
                parts.append(chunk)
                need -= len(chunk)
            elif not data:
                break  # the span is used up and zlib holds nothing more
        self.out += parts
        self.size += n - need
        return parts

    def walk(self) -> None:
        """Every member, header and declared data, until the span is used up."""
        pax_size_raw: bytes | None = None
        while True:
            at = self.size
            header = b"".join(self.inflate(BLOCK))
            if len(header) < BLOCK:
                return  # the end of the span, or a partial block (reported by the caller)
            if not header.strip(b"\0"):
                raise ShardFormatError(
                    f"{self.where}: more data than its tar headers declare: a zero block at "
                    f"byte {at} of the inflated sample, after its members (a decompression "
                    "bomb or a corrupt shard)"
                )
            size = parse_octal(header[SIZE]) if checksum_ok(header) else None
            if size is None:
                raise ShardFormatError(
                    f"{self.where}: corrupt tar header at byte {at} of the inflated sample "
                    "(checksum mismatch or bad size field)"
                )
            flag = header[TYPEFLAG.start]
            if flag in _EXTENSIONS:
                if size > MAX_EXTENSION_BYTES:
                    raise ShardFormatError(
                        f"{self.where}: extension header of {size} bytes at byte {at} of the "
                        f"inflated sample (more than {MAX_EXTENSION_BYTES})"
                    )
                data = b"".join(self.inflate(padded(size)))
                if flag == ord("x") and len(data) >= size:
                    pax_size_raw = pax_path_size(data[:size], self.where, at)[1]
            else:
                if pax_size_raw is not None:
                    size = pax_size(pax_size_raw, f"{self.where}: byte {at}")
                if self.max_length is not None and self.size + padded(size) > self.max_length:
                    raise ShardFormatError(
                        f"{self.where}: the member at byte {at} of the inflated sample "
                        f"declares {size} bytes, past max_length={self.max_length}"
                    )
                self.inflate(padded(size))
                pax_size_raw = None
            if self.size < at + BLOCK + padded(size):
                return  # truncated: the caller's block check or the tar parser names it
