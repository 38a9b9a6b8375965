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


def inflate_sample(span: bytes | memoryview, where: str) -> bytes:
    """The tar bytes of one sample from its compressed bytes ``span`` (an index range of a
    gzip shard); :class:`ShardFormatError` starting with ``where`` (the shard and the sample)
    when the span is not one whole flushed piece of deflate data holding whole tar blocks."""
    if len(span) < len(_FLUSH_MARK) or span[-len(_FLUSH_MARK) :] != _FLUSH_MARK:
        raise ShardFormatError(
            f"{where}: compressed sample does not end at a flush point (a corrupt shard, or an "
            "index that does not match it; is this a .tar.gz written by another tool?)"
        )
    z = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        data = z.decompress(span)
    except zlib.error as exc:
        raise ShardFormatError(f"{where}: corrupt compressed data: {exc}") from None
    if z.eof or z.unused_data:
        raise ShardFormatError(
            f"{where}: the compressed stream ends inside the sample's range (corrupt data or "
            "an index that does not match the shard)"
        )
    if not data or len(data) % 512:
        raise ShardFormatError(
            f"{where}: inflated to {len(data)} bytes, not a whole number of 512-byte tar "
            "blocks (corrupt compressed data)"
        )
    return data
