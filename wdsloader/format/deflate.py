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
    padded,
    parse_octal,
)

COMPRESSIONS = ("gzip",)
"""The values of a shard's ``compression`` in the manifest."""

GZIP_SUFFIX = ".gz"
GZIP_LEVEL = 6
"""The deflate level of gzip shards: zlib's and ``gzip``'s default. On the small records of
``bench/experiments/small_records.py`` (CPU per sample of the deflate step alone): grouped samples level 1
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
    """The tar bytes of one sample from its compressed bytes ``span`` (an index range of a
    gzip shard); :class:`ShardFormatError` starting with ``where`` (the shard and the sample)
    when the span is not one whole flushed piece of deflate data holding whole tar blocks.

    Inflation follows the sample's tar headers: a header, the data it declares (padded to 512
    bytes), the next header. Anything else in the span (a zero block, or more data after the
    last member: a decompression bomb or a corrupt shard) is a :class:`ShardFormatError` as
    soon as it is inflated; the output is inflated in steps of at most 64 KiB past what the
    headers declare, so memory stays bounded by the sample's declared size. With
    ``max_length``, no more than ``max_length`` bytes are ever held (one more is inflated to
    tell): a sample whose headers declare more, or whose data runs past them, is refused.
    Only the headers' size fields are read here; the tar parser checks the headers after.
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
    data = stream.buf
    if not data or len(data) % BLOCK:
        raise ShardFormatError(
            f"{where}: inflated to {len(data)} bytes, not a whole number of 512-byte tar "
            "blocks (corrupt compressed data)"
        )
    return bytes(data)


_STEP = 1 << 16  # inflated bytes asked of zlib at least at a time (past the declared: at most)
_MAX_RATIO = 1032  # deflate's most inflated bytes per compressed byte (258 per 2-bit match)
_EXTENSIONS = frozenset(b"xgLK")  # headers whose data describes the next member
_PAX = ord("x")
_TYPE_AT = TYPEFLAG.start
_SIZE_AT, _SIZE_END = SIZE.start, SIZE.stop
_SIZES: dict[bytes, int | None] = {}  # size fields seen (a shard repeats few): their values
_SIZES_MAX = 4096


def _size(field: bytes) -> int | None:
    """The value of a tar size field (None when malformed), remembered."""
    if len(_SIZES) >= _SIZES_MAX:
        _SIZES.clear()
    size = _SIZES[field] = parse_octal(field)
    return size


class _Inflating:
    """One sample's raw deflate stream inflated as its tar headers say (see
    :func:`inflate_sample`) into ``buf``."""

    def __init__(self, span: bytes | memoryview, where: str, max_length: int | None) -> None:
        self.z = zlib.decompressobj(-zlib.MAX_WBITS)
        self.span = memoryview(span)
        self.pos = 0
        self.where = where
        self.max_length = max_length
        self.buf = bytearray()
        self.spent = False  # the span is used up and zlib holds no more output

    def fill(self, upto: int) -> bool:
        """Inflate until ``buf`` holds ``upto`` bytes; False when the span ends first."""
        buf, limit = self.buf, self.max_length
        while len(buf) < upto:
            want = max(upto - len(buf), _STEP)
            if limit is not None and len(buf) + want > limit:
                want = limit - len(buf)
                if want == 0:
                    if self._inflate(1):
                        raise ShardFormatError(
                            f"{self.where}: the sample inflates to more than max_length={limit} "
                            "bytes"
                        )
                    return False
            if not self._inflate(want):
                return False
        return True

    def _inflate(self, n: int) -> int:
        """Inflate up to ``n`` more bytes into ``buf``; how many came (0: the span is used up)."""
        got = 0
        while got < n and not self.spent:
            data: bytes | memoryview = self.z.unconsumed_tail
            if not data:
                data = self.span[self.pos :]
                self.pos = len(self.span)
            chunk = self.z.decompress(data, n - got)
            self.buf += chunk
            got += len(chunk)
            # all input taken and less output than asked for: zlib holds nothing more
            self.spent = self.z.eof or (got < n and not self.z.unconsumed_tail)
        return got

    def walk(self) -> None:
        """Every member, header and declared data, until the span is used up.

        Only the size fields are read here (what bounds the inflation); the tar parser checks
        every header afterwards, as in a plain shard."""
        buf, limit = self.buf, self.max_length
        at = 0  # where the next header starts
        pax_size_raw: bytes | None = None
        while len(buf) >= at + BLOCK or self.fill(at + BLOCK):
            flag = buf[at + _TYPE_AT]
            field = bytes(buf[at + _SIZE_AT : at + _SIZE_END])
            size = _SIZES.get(field)
            if size is None:
                size = _size(field)
            if size is None or (buf[at] == 0 and not buf[at : at + BLOCK].strip(b"\0")):
                raise self._bad_header(at, size is None)
            if flag in _EXTENSIONS:
                if size > MAX_EXTENSION_BYTES:
                    raise ShardFormatError(
                        f"{self.where}: extension header of {size} bytes at byte {at} of the "
                        f"inflated sample (more than {MAX_EXTENSION_BYTES})"
                    )
                if flag == _PAX and self.fill(at + BLOCK + size):
                    data = bytes(buf[at + BLOCK : at + BLOCK + size])
                    pax_size_raw = pax_path_size(data, self.where, at)[1]
            else:
                if pax_size_raw is not None:
                    size = pax_size(pax_size_raw, f"{self.where}: byte {at}")
                    pax_size_raw = None
                if limit is not None and at + BLOCK + padded(size) > limit:
                    raise ShardFormatError(
                        f"{self.where}: the member at byte {at} of the inflated sample "
                        f"declares {size} bytes, past max_length={limit}"
                    )
                if at + BLOCK + padded(size) > _MAX_RATIO * len(self.span) + BLOCK:
                    raise ShardFormatError(
                        f"{self.where}: the member at byte {at} of the inflated sample "
                        f"declares {size} bytes, more than its {len(self.span)} compressed "
                        "bytes can hold (a decompression bomb or a corrupt shard)"
                    )
            at += BLOCK + padded(size)
            if len(buf) < at and not self.fill(at):
                return  # truncated: the caller's block check or the tar parser names it

    def _bad_header(self, at: int, bad_size: bool) -> ShardFormatError:
        if bad_size:
            field = bytes(self.buf[at + SIZE.start : at + SIZE.stop])
            return ShardFormatError(
                f"{self.where}: corrupt tar header at byte {at} of the inflated sample (bad "
                f"size field {field!r})"
            )
        return ShardFormatError(
            f"{self.where}: more data than its tar headers declare: a zero block at byte {at} "
            "of the inflated sample, after its members (a decompression bomb or a corrupt "
            "shard)"
        )
