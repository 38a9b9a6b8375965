"""Steps 2-3 of the plan: equal rank ranges of a sequence of order positions, batch-aligned worker
chunks, the per-worker window shuffle, and a worker's batches computed lazily.

Ranks take equal contiguous ranges of the sequence, after dropping its tail (``drop_last``) or padding
it by wrapping around to its start. Each DataLoader worker of a rank takes one contiguous, batch-aligned
chunk of the rank's range, shuffles it within windows of ``window`` samples, and cuts it into batches;
rank batch ``j`` is the ``j // num_workers``-th batch of worker ``j % num_workers``, the order in which
torch's DataLoader round-robins over its workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast, overload

import numpy as np

from wdsloader.plan.config import WINDOW_TAG, PlanConfig
from wdsloader.plan.order import EpochOrder

__all__ = [
    "Geometry",
    "Positions",
    "Runs",
    "WorkerBatches",
    "batches_before",
    "geometry",
    "window_perm",
]


class Positions(Protocol):
    """A sequence of positions of the epoch order (what a plan runs over), read by index."""

    @property
    def size(self) -> int:
        """Length of the sequence."""
        ...

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The order positions at ``pos`` (int64 array, each in [0, size))."""
        ...


@dataclass(frozen=True, slots=True)
class Runs:
    """An integer sequence stored as back-to-back runs of consecutive values.

    Run ``i`` holds ``starts[i], starts[i] + 1, ...`` at positions ``cum[i] .. cum[i + 1] - 1``.
    """

    starts: np.ndarray
    cum: np.ndarray

    @staticmethod
    def build(starts: np.ndarray, lengths: np.ndarray) -> Runs:
        """The runs of the given starts and lengths (empty runs dropped, adjacent ones merged)."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        keep = lengths > 0
        starts, lengths = starts[keep], lengths[keep]
        if starts.size > 1:  # merge runs that continue one another
            heads = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1]) + 1
            heads = np.concatenate([np.zeros(1, np.int64), heads])
            starts, lengths = starts[heads], np.add.reduceat(lengths, heads)
        cum = np.zeros(starts.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=cum[1:])
        return Runs(starts, cum)

    @staticmethod
    def identity(n: int) -> Runs:
        """``0, 1, ..., n - 1``."""
        return Runs.build(np.zeros(1, np.int64), np.array([n], np.int64))

    @property
    def size(self) -> int:
        """Length of the sequence."""
        return int(self.cum[-1])

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The values at positions ``pos`` (int64 array, each in [0, size))."""
        out: np.ndarray
        if self.starts.size == 1:
            out = pos + self.starts[0]
            return out
        run = np.searchsorted(self.cum, pos, side="right") - 1
        out = self.starts[run] + (pos - self.cum[run])
        return out

    def restrict(self, lo: np.ndarray, hi: np.ndarray) -> Runs:
        """The subsequence at the positions of the sorted, disjoint intervals ``[lo[i], hi[i])``."""
        if lo.size == 0:
            return Runs.build(np.zeros(0, np.int64), np.zeros(0, np.int64))
        cuts = np.sort(np.concatenate([lo, hi, self.cum]))
        cuts = cuts[np.concatenate([[True], cuts[1:] != cuts[:-1]])]  # np.union1d, sort-based
        seg_lo, seg_hi = cuts[:-1], cuts[1:]
        owner = np.searchsorted(lo, seg_lo, side="right") - 1
        keep = (owner >= 0) & (seg_hi <= hi[np.maximum(owner, 0)])
        seg_lo, seg_hi = seg_lo[keep], seg_hi[keep]
        return Runs.build(self.take(seg_lo), seg_hi - seg_lo)


@dataclass(frozen=True, slots=True)
class Geometry:
    """Steps 2-3 for a sequence of ``size`` samples: rank ranges and per-worker chunks.

    Position ``q`` of the (truncated or padded) sequence is index ``(q + rot) % size`` of the source
    sequence; rank ``r`` owns ``[r * per_rank, (r + 1) * per_rank)``; plan worker ``p`` owns the
    rank-local chunk ``[chunk_start[p], chunk_start[p] + chunk_len[p])`` holding ``n_batches[p]``
    batches.
    """

    size: int
    per_rank: int
    batches: int
    rot: int
    chunk_start: np.ndarray
    chunk_len: np.ndarray
    n_batches: np.ndarray


def geometry(cfg: PlanConfig, epoch: int, size: int) -> Geometry:
    """The rank ranges and worker chunks of ``cfg`` over a sequence of ``size`` samples."""
    world, bsz, nw = cfg.world_size, cfg.batch_size, cfg.num_workers
    rot = 0
    if cfg.drop_last:
        per_rank = (size // (world * bsz)) * bsz
        if not cfg.shuffle and size:
            rot = (epoch * (size - world * per_rank)) % size
    else:
        per_rank = -(-size // world)
    nb = -(-per_rank // bsz)
    workers = np.arange(nw, dtype=np.int64)
    n_batches = np.maximum(0, -(-(nb - workers) // nw))
    chunk_len = n_batches * bsz
    chunk_start = np.zeros(nw, dtype=np.int64)
    if nb:
        last = (nb - 1) % nw  # yields the final, possibly partial, batch: its chunk is the tail
        chunk_len[last] -= nb * bsz - per_rank
        layout = (last + 1 + workers) % nw
        chunk_start[layout] = np.cumsum(chunk_len[layout]) - chunk_len[layout]
    return Geometry(size, per_rank, nb, rot, chunk_start, chunk_len, n_batches)


def batches_before(k: int, nw: int) -> np.ndarray:
    """Batches each plan worker has yielded once its rank has yielded ``k``."""
    return np.maximum(0, -(-(k - np.arange(nw, dtype=np.int64)) // nw))


def windowed(cfg: PlanConfig) -> bool:
    """Whether workers shuffle their chunks within windows."""
    return cfg.shuffle and cfg.window > 1


def window_perm(
    cfg: PlanConfig, epoch: int, rank: int, worker: int, n: int, lo: int, hi: int
) -> np.ndarray:
    """Entries ``lo .. hi - 1`` of the yield order of a chunk of ``n`` samples (chunk offsets).

    The order permutes each window of ``window`` samples by sorting one float64 key per sample
    drawn from a generator seeded per (seed, epoch, rank, worker); only the windows that hold
    entries ``lo .. hi - 1`` are drawn.
    """
    if not windowed(cfg) or n <= 1:
        return np.arange(lo, hi, dtype=np.int64)
    w = cfg.window
    first, end = (lo // w) * w, min(n, -(-hi // w) * w)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, epoch, rank, worker, WINDOW_TAG]))
    cast(np.random.PCG64, rng.bit_generator).advance(first)  # one 64-bit draw per float64 key
    keys = rng.random(end - first)
    full = ((end - first) // w) * w
    perm = np.empty(end - first, dtype=np.int64)
    if full:
        inner = np.argsort(keys[:full].reshape(-1, w), axis=1, kind="stable")
        perm[:full] = (inner + np.arange(0, full, w, dtype=np.int64)[:, None]).ravel()
    if full < perm.size:
        perm[full:] = full + np.argsort(keys[full:], kind="stable")
    out: np.ndarray = perm[lo - first : hi - first] + first
    return out


class WorkerBatches(Sequence[np.ndarray]):
    """The batches (int64 global ids) one plan worker yields, computed when indexed.

    ``chunk`` maps chunk offsets to positions of the epoch order (``base`` after the geometry's
    rotation); the first ``skip`` batches of the worker are left out. A slice is computed in one
    go (the windows it touches); nothing is kept between calls.
    """

    def __init__(
        self,
        cfg: PlanConfig,
        epoch: int,
        rank: int,
        worker: int,
        skip: int,
        *,
        base: Positions,
        order: EpochOrder,
        geom: Geometry,
    ) -> None:
        self._key = (cfg, epoch, rank, worker)
        self._n = int(geom.chunk_len[worker])
        self._first = min(self._n, skip * cfg.batch_size)
        self._bsz = cfg.batch_size
        self._start = rank * geom.per_rank + int(geom.chunk_start[worker])
        self._base, self._order, self._geom = base, order, geom

    def __len__(self) -> int:
        return -(-(self._n - self._first) // self._bsz)

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """Global ids of entries ``lo .. hi - 1`` of the remaining yield order (int64)."""
        lo, hi = self._first + lo, min(self._n, self._first + hi)
        if hi <= lo:
            return np.zeros(0, np.int64)
        offsets = window_perm(*self._key, self._n, lo, hi)
        g = self._geom
        return self._order.take(self._base.take((self._start + offsets + g.rot) % g.size))

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        n = len(self)
        if isinstance(index, slice):
            picked = range(n)[index]
            if picked.step != 1:
                return [self[i] for i in picked]
            ids = self.ids(picked.start * self._bsz, picked.stop * self._bsz)
            return np.split(ids, np.arange(self._bsz, ids.size, self._bsz)) if ids.size else []
        i = range(n)[index]  # IndexError when out of range, negative indices count from the end
        return self.ids(i * self._bsz, (i + 1) * self._bsz)
