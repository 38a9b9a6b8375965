"""The mix plan: which samples of which source each rank and worker yields, per epoch.

Pure functions, no I/O and no global random state; the same inputs give the same plan on every
process. Quotas use the largest-remainder (Hamilton) method in exact rational arithmetic.

- Quotas (:func:`~wdsloader.plan.quotas.mix_quotas`): per epoch, each source's exact number of samples.
- Selection (:func:`source_ids`): each source is read as an endless stream that cycles through
  one keyed order of its samples; epoch ``e`` takes the next ``quota`` stream positions after
  those of the earlier epochs (``offsets``). A quota above the size repeats each sample ``k`` or
  ``k + 1`` times, one below it takes distinct samples, and consecutive epochs continue where
  the last one stopped: every sample comes before any comes twice, also when weights change.
- Order: ``batching="mixed"`` (:func:`mixed_layout`) puts blocks of the sources' epoch samples
  in a keyed order and deals it like a single source (rank ranges, worker chunks, window
  shuffle: :mod:`wdsloader.plan`); ``"stratified"`` gives every global batch each source's
  exact share. Both map a position to ``(source, sample)`` arithmetically, so a rank computes
  only its own batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import overload

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.lazy import moved_names
from wdsloader.plan.batches import epoch_dropped, epoch_padding, num_batches, worker_batches
from wdsloader.plan.config import PlanConfig
from wdsloader.plan.mix_stream import (
    _STRAT_TAG,
    MixEpoch,
    _key,
    _permute,
    _to_ids,
    epoch_offsets,
    mixed_layout,
    source_ids,
)
from wdsloader.plan.quotas import largest_remainder
from wdsloader.plan.resume import Resume

__all__ = [
    "MixBatchIds",
    "GlobalIds",
    "MixEpoch",
    "MixTopology",
    "MixedBatches",
    "StratifiedBatches",
    "epoch_offsets",
    "mix_dropped",
    "mix_num_batches",
    "mix_padding",
    "mix_plan_config",
    "mix_rank_batches",
    "mix_worker_batches",
    "mixed_layout",
    "source_ids",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MixTopology:
    """How the epoch is dealt: ``batch_size`` per rank, ``world_size`` ranks, ``num_workers``
    plan workers per rank (at least 1), ``drop_last``, the per-worker shuffle ``window`` (samples;
    ``batching="mixed"`` only) and ``batching``: ``"mixed"`` or ``"stratified"``."""

    batch_size: int
    world_size: int = 1
    num_workers: int = 1
    drop_last: bool = True
    window: int = 0
    batching: str = "mixed"

    def __post_init__(self) -> None:
        for name in ("batch_size", "world_size", "num_workers"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 1))
        object.__setattr__(self, "window", as_int(self.window, "window", 0))
        if self.batching not in ("mixed", "stratified"):
            raise ValueError(f"batching must be 'mixed' or 'stratified', got {self.batching!r}")


_TOPOLOGY = ("batch_size", "world_size", "num_workers", "drop_last", "window")


def mix_plan_config(me: MixEpoch, topo: MixTopology) -> PlanConfig:
    """``batching="mixed"``: the single-source plan over the epoch's positions that deals the
    mixed order (rank ranges, worker chunks, window shuffle); its resumes are mix resumes."""
    return PlanConfig(
        counts=(me.length,), batch_size=topo.batch_size, world_size=topo.world_size,
        num_workers=topo.num_workers, seed=me.seed, shuffle=True, drop_last=topo.drop_last,
        span=max(me.length, 1), window=topo.window,
    )  # fmt: skip


def _on(resume: Resume | None, base: PlanConfig) -> Resume | None:
    """``resume`` (a chain whose configs give each run's topology) on the plan ``base``."""
    if resume is None:
        return None
    cfg = replace(base, **{k: getattr(resume.config, k) for k in _TOPOLOGY})
    return Resume(cfg, resume.batches_done, _on(resume.prior, base))


def _strata_done(topo: MixTopology, resume: Resume | None) -> int:
    """Batches done under ``resume`` for ``batching="stratified"`` (same topology only)."""
    if resume is None:
        return 0
    same = all(getattr(resume.config, k) == getattr(topo, k) for k in _TOPOLOGY)
    if resume.prior is not None or not same:
        raise ValueError(
            'batching="stratified" resumes only on the topology it was saved with (world_size, '
            'num_workers, batch_size, drop_last, window); use batching="mixed" for elastic resume'
        )
    return resume.batches_done


#: One mixed batch: the source and the sample id (in that source) of each of its samples.
MixBatchIds = tuple[np.ndarray, np.ndarray]

# ``Batch``: the old name, until 0.2.0 (``wdsloader.Batch`` is a training batch, a dict).
__getattr__ = moved_names(__name__, {"Batch": ("wdsloader.plan.mix", "MixBatchIds")})


def mix_num_batches(me: MixEpoch, topo: MixTopology, resume: Resume | None = None) -> int:
    """Batches every rank yields in the epoch (from ``resume`` on); the same on every rank.

    ``resume`` is a plan :class:`~wdsloader.plan.Resume` chain whose configs give the topology
    of each run (any config with those fields; the rest is the mix's own).
    """
    if topo.batching == "mixed":
        cfg = mix_plan_config(me, topo)
        return num_batches(cfg, epoch=me.epoch, resume=_on(resume, cfg))
    done = _strata_done(topo, resume)
    total = _strata(me, topo).batches
    if done > total:
        raise ValueError(f"batches_done={done} is more than the epoch's {total} batches")
    return total - done


def mix_padding(me: MixEpoch, topo: MixTopology) -> int:
    """Samples delivered twice in the epoch so every rank gets its batches (drop_last=False)."""
    if topo.batching == "mixed":
        return epoch_padding(mix_plan_config(me, topo), epoch=me.epoch)
    last = me.length % (topo.world_size * topo.batch_size)
    if topo.drop_last or not last:
        return 0
    return -(-last // topo.world_size) * topo.world_size - last


def mix_dropped(me: MixEpoch, topo: MixTopology) -> int:
    """Samples of the epoch's quotas left out so every batch is full (drop_last=True)."""
    if topo.batching == "mixed":
        return epoch_dropped(mix_plan_config(me, topo), epoch=me.epoch)
    return me.length % (topo.world_size * topo.batch_size) if topo.drop_last else 0


class MixedBatches(Sequence[MixBatchIds]):
    """``batching="mixed"``: the batches one worker yields, computed when indexed (a slice in
    one go: one evaluation of the keyed orders for all its samples)."""

    def __init__(self, me: MixEpoch, positions: Sequence[np.ndarray]) -> None:
        self.me, self.positions = me, positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, index: int) -> MixBatchIds: ...

    @overload
    def __getitem__(self, index: slice) -> list[MixBatchIds]: ...

    def __getitem__(self, index: int | slice) -> MixBatchIds | list[MixBatchIds]:
        if not isinstance(index, slice):
            return mixed_layout(self.me, self.positions[index])
        parts = self.positions[index]
        if not parts:
            return []
        src, ids = mixed_layout(self.me, np.concatenate(parts))
        cuts = np.cumsum([len(p) for p in parts])[:-1]
        return list(zip(np.split(src, cuts), np.split(ids, cuts), strict=True))


class StratifiedBatches(Sequence[MixBatchIds]):
    """``batching="stratified"``: the batches one worker of ``rank`` yields, the global
    batches ``steps`` (a range), computed when indexed."""

    def __init__(
        self, me: MixEpoch, topo: MixTopology, rank: int, strata: _Strata, steps: range
    ) -> None:
        self.me, self.topo, self.rank, self.strata, self.steps = me, topo, rank, strata, steps

    def __len__(self) -> int:
        return len(self.steps)

    @overload
    def __getitem__(self, index: int) -> MixBatchIds: ...

    @overload
    def __getitem__(self, index: slice) -> list[MixBatchIds]: ...

    def __getitem__(self, index: int | slice) -> MixBatchIds | list[MixBatchIds]:
        if isinstance(index, slice):
            return [
                self.strata.rank_batch(self.me, self.topo, t, self.rank) for t in self.steps[index]
            ]
        return self.strata.rank_batch(self.me, self.topo, self.steps[index], self.rank)


class GlobalIds(Sequence[np.ndarray]):
    """Batches of ``(source, id)`` as ids of the sources' samples concatenated:
    ``offsets[source] + id`` (computed when indexed)."""

    def __init__(self, batches: Sequence[MixBatchIds], offsets: np.ndarray) -> None:
        self.batches, self.offsets = batches, np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.batches)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if not isinstance(index, slice):
            src, ids = self.batches[index]
            out: np.ndarray = self.offsets[src] + ids
            return out
        return [self.offsets[src] + ids for src, ids in self.batches[index]]


def mix_worker_batches(
    me: MixEpoch, topo: MixTopology, rank: int, worker: int, resume: Resume | None = None
) -> Sequence[MixBatchIds]:
    """The batches DataLoader worker ``worker`` of ``rank`` yields (from ``resume`` on, as
    :func:`mix_num_batches`): rank batches ``worker, worker + num_workers, ...`` (torch's
    round-robin over workers, as :func:`~wdsloader.plan.worker_batches`). ``batching="mixed"``
    resumes elastically on another topology; ``"stratified"`` on the same one only."""
    rank = as_int(rank, "rank", 0, topo.world_size - 1)
    worker = as_int(worker, "worker", 0, topo.num_workers - 1)
    if topo.batching == "mixed":
        cfg = mix_plan_config(me, topo)
        return MixedBatches(me, worker_batches(cfg, me.epoch, rank, worker, _on(resume, cfg)))
    strata = _strata(me, topo)
    first = _strata_done(topo, resume) + worker
    return StratifiedBatches(me, topo, rank, strata, range(first, strata.batches, topo.num_workers))


def mix_rank_batches(
    me: MixEpoch, topo: MixTopology, rank: int, resume: Resume | None = None
) -> list[MixBatchIds]:
    """All batches of ``rank`` in the order its DataLoader yields them (from ``resume`` on)."""
    lists = [mix_worker_batches(me, topo, rank, w, resume) for w in range(topo.num_workers)]
    longest = max((len(lst) for lst in lists), default=0)
    return [lst[j] for j in range(longest) for lst in lists if j < len(lst)]


@dataclass(frozen=True, slots=True)
class _Strata:
    """``batching="stratified"``: global batch ``t < full`` (``G = world * batch`` samples) holds
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
    batches: int

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

    def rank_batch(self, me: MixEpoch, topo: MixTopology, t: int, rank: int) -> MixBatchIds:
        counts = self.counts(t)
        size = int(counts.sum())
        per = topo.batch_size if t < self.full else -(-size // topo.world_size)
        pos = (rank * per + np.arange(per, dtype=np.int64)) % size
        pos = _permute(size, _key(me.seed, me.epoch, t, _STRAT_TAG), pos)
        start = np.cumsum(counts) - counts
        src = np.searchsorted(start, pos, side="right") - 1
        k = self.before(t)[src] + pos - start[src]
        return src, _to_ids(me, src, k)


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
    batches = full + (1 if last and not topo.drop_last else 0)
    return _Strata(full, base, extra, start, body, last, tail, batches)
