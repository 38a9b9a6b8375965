"""The batch reader's step for compressed shards: each sample's compressed bytes (the index's
range) inflated, so the decoders see tar bytes as from a plain shard."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from wdsloader.decode.batch import RawBatch
from wdsloader.errors import WdsLoaderError
from wdsloader.format import ShardInfo
from wdsloader.format.deflate import inflate_sample


class Inflater:
    """Turns a :class:`RawBatch` read from ``shards`` (some compressed) into one of tar bytes.

    When every sample inflates, the result holds one buffer with the samples back to back (the
    columnar decoder may read it); ``base`` then maps a sample's first inflated byte to its
    compressed start in the shard. A sample that does not inflate becomes its
    :class:`~wdsloader.errors.ShardFormatError` (naming the shard, the sample's number and the
    problem) in ``data``, with ``buf`` None: the row decoder then raises or skips it like any
    corrupt sample. ``url`` names a shard in errors.
    """

    def __init__(self, shards: Sequence[ShardInfo], url: Callable[[ShardInfo], str]) -> None:
        self.compressed = np.array([s.compression is not None for s in shards], dtype=bool)
        self.shards = list(shards)
        self.url = url

    def __call__(self, raw: RawBatch) -> RawBatch:
        if not self.compressed[raw.shard].any():
            return raw
        pieces: list[bytes | Exception] = []
        failed = False
        for j in range(len(raw)):
            piece = self._sample(raw, j)
            failed = failed or isinstance(piece, Exception)
            pieces.append(piece)
        sizes = np.array([0 if isinstance(p, Exception) else len(p) for p in pieces], np.int64)
        if failed:  # each sample on its own, the failures as their errors
            zeros = np.zeros(len(raw), dtype=np.int64)
            return RawBatch(None, pieces, zeros, sizes, raw.base + raw.start, raw.shard, raw.local)
        joined = b"".join(pieces)  # type: ignore[arg-type]  # no exception among them
        stop = np.cumsum(sizes)
        start = stop - sizes
        base = raw.base + raw.start - start
        buf = np.frombuffer(joined, dtype=np.uint8)
        return RawBatch(buf, [joined] * len(raw), start, stop, base, raw.shard, raw.local)

    def _sample(self, raw: RawBatch, j: int) -> bytes | Exception:
        data = raw.data[j]
        if isinstance(data, Exception):
            return data
        s = int(raw.shard[j])
        span = memoryview(data)[int(raw.start[j]) : int(raw.stop[j])]
        if not self.compressed[s]:
            return bytes(span)
        try:
            return inflate_sample(span, f"{self.url(self.shards[s])}: sample #{int(raw.local[j])}")
        except WdsLoaderError as exc:
            return exc
