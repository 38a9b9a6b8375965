"""The mix plan: which samples of which source each rank and worker yields, per epoch.

Pure functions, no I/O and no global random state; the same inputs give the same plan on every
process. Quotas use the largest-remainder (Hamilton) method in exact rational arithmetic.

- Quotas (:func:`~wdsloader.plan.quotas.mix_quotas`): per epoch, each source's exact number of samples.
- Selection (:func:`source_ids`): each source is read as an endless stream that cycles through
  one keyed order of its samples; epoch ``e`` takes the next ``quota`` stream positions after
  those of the earlier epochs (``offsets``). A quota above the size repeats each sample ``k`` or
  ``k + 1`` times, one below it takes distinct samples, and consecutive epochs continue where
  the last one stopped: every sample comes before any comes twice, also when weights change.
- Order: the topology's ``batching`` strategy (:mod:`wdsloader.plan.batching`, a registry):
  ``"mixed"`` (:func:`mixed_layout`) puts blocks of the sources' epoch samples in a keyed order
  and deals it like a single source (rank ranges, worker chunks, window shuffle:
  :mod:`wdsloader.plan`); ``"stratified"`` gives every global batch each source's exact share.
  Both map a position to ``(source, sample)`` arithmetically, so a rank computes only its own
  batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.lazy import moved_names
from wdsloader.plan.batching import (
    GlobalBatches,
    MixBatchIds,
    MixedBatches,
    MixTopology,
    mix_plan_config,
)
from wdsloader.plan.mix_stream import MixEpoch, epoch_offsets, mixed_layout, source_ids
from wdsloader.plan.mix_stream import _key as _key  # the keyed permutation, read by tests here
from wdsloader.plan.mix_stream import _permute as _permute
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

#: ``batching="stratified"``'s batches of one worker (any strategy over global batches').
StratifiedBatches = GlobalBatches

# ``Batch``: the old name, until 0.2.0 (``wdsloader.Batch`` is a training batch, a dict).
__getattr__ = moved_names(__name__, {"Batch": ("wdsloader.plan.mix", "MixBatchIds")})


def mix_num_batches(me: MixEpoch, topo: MixTopology, resume: Resume | None = None) -> int:
    """Batches every rank yields in the epoch (from ``resume`` on); the same on every rank.

    ``resume`` is a plan :class:`~wdsloader.plan.Resume` chain whose configs give the topology
    of each run (any config with those fields; the rest is the mix's own).
    """
    return topo.strategy.num_batches(me, topo, resume)


def mix_padding(me: MixEpoch, topo: MixTopology) -> int:
    """Samples delivered twice in the epoch so every rank gets its batches (drop_last=False)."""
    return topo.strategy.padding(me, topo)


def mix_dropped(me: MixEpoch, topo: MixTopology) -> int:
    """Samples of the epoch's quotas left out so every batch is full (drop_last=True)."""
    return topo.strategy.dropped(me, topo)


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
    return topo.strategy.worker_batches(me, topo, rank, worker, resume)


def mix_rank_batches(
    me: MixEpoch, topo: MixTopology, rank: int, resume: Resume | None = None
) -> list[MixBatchIds]:
    """All batches of ``rank`` in the order its DataLoader yields them (from ``resume`` on)."""
    lists = [mix_worker_batches(me, topo, rank, w, resume) for w in range(topo.num_workers)]
    longest = max((len(lst) for lst in lists), default=0)
    return [lst[j] for j in range(longest) for lst in lists if j < len(lst)]
