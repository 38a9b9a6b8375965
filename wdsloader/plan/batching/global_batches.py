"""Strategies that fill each global batch on its own (:class:`GlobalBatching`): a subclass says
which source and which of its epoch samples each slot of global batch ``t`` holds; the base
deals the slots to ranks and the rank's batches to workers, and counts batches, padding and
dropped samples. Such a strategy resumes on the topology it was saved with only."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, overload

import numpy as np

from wdsloader.plan.batching.base import MixBatchIds, MixTopology, same_topology_done
from wdsloader.plan.mix_stream import MixEpoch, epoch_ids
from wdsloader.plan.resume import Resume

__all__ = ["GlobalBatches", "GlobalBatching", "Slots", "global_batch_count"]

#: ``slots(t, pos)``: the ``(source, k)`` of slots ``pos`` (int64, in ``[0, size)``) of global
#: batch ``t``: each slot's source and its position among that source's epoch samples
#: (``[0, quota)``); over an epoch's slots every ``(source, k)`` comes once.
Slots = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]


def global_batch_count(me: MixEpoch, topo: MixTopology) -> int:
    """Global batches of ``world_size * batch_size`` samples in the epoch, with the last short
    one when ``drop_last=False``."""
    full, last = divmod(me.length, topo.world_size * topo.batch_size)
    return full + (1 if last and not topo.drop_last else 0)


class GlobalBatching(ABC):
    """A :class:`~wdsloader.plan.batching.BatchingStrategy` over global batches: global batch
    ``t`` holds epoch positions ``[t * G, (t + 1) * G)`` (``G = world_size * batch_size``; a
    last short batch of ``L < G`` samples with ``drop_last=False``, dropped otherwise); rank
    ``r`` gets its slots ``[r * batch_size, (r + 1) * batch_size)`` (of the short batch, slots
    ``r * ceil(L / world_size) + i`` modulo ``L``: a few repeated so every rank gets one
    batch). Subclasses give their ``name`` and :meth:`slots`: which samples fill the slots."""

    name: ClassVar[str]
    elastic: ClassVar[bool] = False

    @abstractmethod
    def slots(self, me: MixEpoch, topo: MixTopology) -> Slots:
        """The slot assignment of the epoch ``me`` dealt over ``topo`` (see :data:`Slots`);
        called once per worker and epoch, so it may precompute what every batch shares."""

    def num_batches(self, me: MixEpoch, topo: MixTopology, resume: Resume | None = None) -> int:
        """Batches every rank yields in the epoch (from ``resume`` on)."""
        done = same_topology_done(topo, resume)
        total = global_batch_count(me, topo)
        if done > total:
            raise ValueError(f"batches_done={done} is more than the epoch's {total} batches")
        return total - done

    def padding(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples delivered twice in the short last global batch (``drop_last=False``)."""
        last = me.length % (topo.world_size * topo.batch_size)
        if topo.drop_last or not last:
            return 0
        return -(-last // topo.world_size) * topo.world_size - last

    def dropped(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples of the short last global batch, left out with ``drop_last=True``."""
        return me.length % (topo.world_size * topo.batch_size) if topo.drop_last else 0

    def worker_batches(
        self, me: MixEpoch, topo: MixTopology, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[MixBatchIds]:
        """Global batches ``done + worker, done + worker + num_workers, ...`` of ``rank``."""
        slots = self.slots(me, topo)
        first = same_topology_done(topo, resume) + worker
        steps = range(first, global_batch_count(me, topo), topo.num_workers)
        return GlobalBatches(me, topo, rank, slots, steps)


class GlobalBatches(Sequence[MixBatchIds]):
    """The part of ``rank`` in the global batches ``steps`` (a range), computed when indexed."""

    def __init__(
        self, me: MixEpoch, topo: MixTopology, rank: int, slots: Slots, steps: range
    ) -> None:
        self.me, self.topo, self.rank, self.slots, self.steps = me, topo, rank, slots, steps
        self.full = me.length // (topo.world_size * topo.batch_size)

    def __len__(self) -> int:
        return len(self.steps)

    @overload
    def __getitem__(self, index: int) -> MixBatchIds: ...

    @overload
    def __getitem__(self, index: slice) -> list[MixBatchIds]: ...

    def __getitem__(self, index: int | slice) -> MixBatchIds | list[MixBatchIds]:
        if isinstance(index, slice):
            return [self.rank_batch(t) for t in self.steps[index]]
        return self.rank_batch(self.steps[index])

    def rank_batch(self, t: int) -> MixBatchIds:
        """The rank's batch of global batch ``t``."""
        topo, me = self.topo, self.me
        g = topo.world_size * topo.batch_size
        size = g if t < self.full else me.length - self.full * g
        per = topo.batch_size if t < self.full else -(-size // topo.world_size)
        pos = (self.rank * per + np.arange(per, dtype=np.int64)) % size
        src, k = self.slots(t, pos)
        return src, epoch_ids(me, src, k)
