"""``batching="stratified"``: every global batch holds each source's exact share of it (the
remainders dealt in rotation), its slots in a keyed order; resumes on the same topology only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wdsloader.plan.batching.base import MixTopology
from wdsloader.plan.batching.global_batches import GlobalBatching, Slots
from wdsloader.plan.mix_stream import MixEpoch, _key, _permute
from wdsloader.plan.quotas import largest_remainder

__all__ = ["StratifiedBatching"]

_STRAT_TAG = 0x57A7_5EED  # keys the order of a global batch's slots


@dataclass(frozen=True, slots=True)
class _Strata:
    """Global batch ``t < full`` (``G = world * batch`` samples) holds
    ``base[s] + (1 if (t - start[s]) % full < extra[s] else 0)`` samples of source ``s``: each
    source's exact share rounded down, the remainders dealt in rotation so that the ``full``
    batches hold ``body[s]`` samples of it; a last short batch (``drop_last=False``) holds the
    largest-remainder share ``tail`` of its ``last`` samples."""

    full: int
    base: np.ndarray
    extra: np.ndarray
    start: np.ndarray
    body: np.ndarray
    last: int
    tail: np.ndarray

    def counts(self, t: int) -> np.ndarray:
        if t == self.full:
            return self.tail
        out: np.ndarray = self.base + ((t - self.start) % self.full < self.extra)
        return out

    def before(self, t: int) -> np.ndarray:
        """Samples of each source in the global batches before ``t``."""
        if t == self.full:
            return self.body
        a = self.start % self.full
        e = self.extra
        wraps = a + e > self.full
        first = np.clip(t - a, 0, np.where(wraps, self.full - a, e))
        second = np.where(wraps, np.minimum(t, a + e - self.full), 0)
        out: np.ndarray = t * self.base + first + second
        return out


def _strata(me: MixEpoch, topo: MixTopology) -> _Strata:
    g = topo.world_size * topo.batch_size
    q = np.asarray(me.quotas, dtype=np.int64)
    full, last = divmod(me.length, g)
    tail = largest_remainder(q.tolist(), last) if last and q.sum() else np.zeros_like(q)
    body = q - tail
    if full:
        base = body * g // (full * g)
        extra = body - full * base
    else:
        base = extra = np.zeros_like(q)
    start = np.cumsum(extra) - extra
    return _Strata(full, base, extra, start, body, last, tail)


class _StrataSlots:
    """The slots of global batch ``t``: its sources' counts laid out in source order, the
    slots read through a permutation keyed by (seed, epoch, t)."""

    def __init__(self, me: MixEpoch, strata: _Strata) -> None:
        self.me, self.strata = me, strata

    def __call__(self, t: int, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        me, strata = self.me, self.strata
        counts = strata.counts(t)
        size = int(counts.sum())
        pos = _permute(size, _key(me.seed, me.epoch, t, _STRAT_TAG), pos)
        start = np.cumsum(counts) - counts
        src = np.searchsorted(start, pos, side="right") - 1
        k = strata.before(t)[src] + pos - start[src]
        return src, k


class StratifiedBatching(GlobalBatching):
    """Each global batch holds each source's exact share: ``floor`` or ``ceil`` of
    ``quota * G / epoch length`` samples, so that the epoch's full batches give every source
    its quota (a short last batch: the largest-remainder share of its samples)."""

    name = "stratified"

    def slots(self, me: MixEpoch, topo: MixTopology) -> Slots:
        return _StrataSlots(me, _strata(me, topo))
