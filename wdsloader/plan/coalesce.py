"""Merging byte ranges into fewer, larger reads (pure numpy, no I/O)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


class Runs(NamedTuple):
    """Merged ranges, ordered by ``(key, start)``, and which run holds each input range."""

    key: IntArray
    start: IntArray
    stop: IntArray
    run_of: IntArray


_LIMIT = 2**62


def coalesce(keys: npt.ArrayLike, starts: npt.ArrayLike, stops: npt.ArrayLike) -> Runs:
    """Merge the ranges ``[starts[i], stops[i])`` of the same ``keys[i]`` (a shard) that overlap,
    repeat or touch one another.

    A run ends at the largest stop among its ranges; ``run_of[i]`` is the run holding range
    ``i``. Raises ValueError when the three arrays differ in length.
    """
    k = np.asarray(keys, dtype=np.int64)
    a = np.asarray(starts, dtype=np.int64)
    b = np.asarray(stops, dtype=np.int64)
    if not len(k) == len(a) == len(b):
        raise ValueError(f"coalesce: {len(k)} keys, {len(a)} starts and {len(b)} stops")
    if len(k) == 0:
        empty = np.empty(0, dtype=np.int64)
        return Runs(empty, empty, empty, empty)
    order = np.lexsort((a, k))
    s_key, s_start, s_stop = k[order], a[order], b[order]
    reach = _reach(s_key, s_start, s_stop)  # the furthest stop of the range and those before it
    new = np.ones(len(order), dtype=bool)
    new[1:] = (s_key[1:] != s_key[:-1]) | (s_start[1:] > reach[:-1])
    firsts = np.flatnonzero(new)
    run_of = np.empty(len(order), dtype=np.int64)
    run_of[order] = np.cumsum(new) - 1
    run_stop = np.maximum.reduceat(s_stop, firsts)
    return Runs(s_key[firsts], s_start[firsts], run_stop.astype(np.int64), run_of)


def _reach(s_key: IntArray, s_start: IntArray, s_stop: IntArray) -> IntArray:
    """Per range (sorted by key, then start): the largest stop among it and the ranges of its
    key before it."""
    group = np.cumsum(np.r_[False, s_key[1:] != s_key[:-1]])
    low = int(min(s_start.min(), s_stop.min()))
    span = int(s_stop.max()) - low + 1
    if int(group[-1]) * span + span < _LIMIT:  # one running maximum, groups lifted apart
        lifted = (s_stop - low) + group * span
        reach: IntArray = np.maximum.accumulate(lifted) - group * span + low
        return reach
    out = np.empty_like(s_stop)
    edges = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True])
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        out[lo:hi] = np.maximum.accumulate(s_stop[lo:hi])
    return out
