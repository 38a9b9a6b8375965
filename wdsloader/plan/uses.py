"""When a pass reads each shard: the first and the last batch that reads it (for a bounded
shard cache, which evicts first what no reader still needs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["shard_uses"]

_CHUNK = 256  # batches computed at a time: the plan's sequences compute batches when sliced


def shard_uses(batches: Sequence[np.ndarray], counts: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(shard index, first batch, last batch)`` of every shard ``batches`` read (global ids
    over shards of ``counts`` samples), in order of first read. This computes every batch of
    the pass once (its cost grows with the pass, unlike the plan's)."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=offsets[1:])
    first = np.full(len(counts), -1, dtype=np.int64)
    last = np.full(len(counts), -1, dtype=np.int64)
    for lo in range(0, len(batches), _CHUNK):
        part = list(batches[lo : lo + _CHUNK])
        ids = np.concatenate(part) if part else np.zeros(0, np.int64)
        if ids.size == 0:
            continue
        shard = np.searchsorted(offsets, ids, side="right") - 1
        pos = np.repeat(np.arange(lo, lo + len(part), dtype=np.int64), [len(b) for b in part])
        seen, at = np.unique(shard, return_index=True)
        new = seen[first[seen] < 0]
        first[new] = pos[at][first[seen] < 0]
        rev_seen, rev_at = np.unique(shard[::-1], return_index=True)
        last[rev_seen] = pos[::-1][rev_at]
    used = np.flatnonzero(first >= 0)
    used = used[np.argsort(first[used], kind="stable")]
    return [(int(s), int(first[s]), int(last[s])) for s in used]
