"""``batching="mixed"``: blocks of the sources' epoch samples in one keyed order
(:func:`~wdsloader.plan.mix_stream.mixed_layout`), dealt like a single source (rank ranges,
worker chunks, window shuffle: :mod:`wdsloader.plan`); it resumes elastically as one source."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, overload

import numpy as np

from wdsloader.plan.batches import epoch_dropped, epoch_padding, num_batches, worker_batches
from wdsloader.plan.batching.base import TOPOLOGY, MixBatchIds, MixTopology
from wdsloader.plan.config import PlanConfig
from wdsloader.plan.mix_stream import MixEpoch, mixed_layout
from wdsloader.plan.resume import Resume

__all__ = ["MixedBatches", "MixedBatching", "mix_plan_config"]


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
    cfg = replace(base, **{k: getattr(resume.config, k) for k in TOPOLOGY})
    return Resume(cfg, resume.batches_done, _on(resume.prior, base))


class MixedBatching:
    """The sources shuffled together: each epoch position's ``(source, sample)`` comes from
    the keyed block order, the positions are dealt by the single-source plan (elastic)."""

    name: ClassVar[str] = "mixed"
    elastic: ClassVar[bool] = True

    def num_batches(self, me: MixEpoch, topo: MixTopology, resume: Resume | None = None) -> int:
        """Batches every rank yields in the epoch (from ``resume`` on)."""
        cfg = mix_plan_config(me, topo)
        return num_batches(cfg, epoch=me.epoch, resume=_on(resume, cfg))

    def padding(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples delivered twice so every rank gets its batches (``drop_last=False``)."""
        return epoch_padding(mix_plan_config(me, topo), epoch=me.epoch)

    def dropped(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples left out so every batch is full (``drop_last=True``)."""
        return epoch_dropped(mix_plan_config(me, topo), epoch=me.epoch)

    def worker_batches(
        self, me: MixEpoch, topo: MixTopology, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[MixBatchIds]:
        """The single-source plan's batches of the worker, as ``(source, sample)``."""
        cfg = mix_plan_config(me, topo)
        return MixedBatches(me, worker_batches(cfg, me.epoch, rank, worker, _on(resume, cfg)))


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
