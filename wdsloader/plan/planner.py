"""The plan as the per-worker dataset asks it (:class:`Planner`), and its single-source answer
(:class:`SinglePlanner`); a sample-level mix answers through
:class:`wdsloader.mix.runtime.MixPlanner`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from wdsloader.plan.batches import epoch_dropped, epoch_padding, num_batches, worker_batches
from wdsloader.plan.config import PlanConfig
from wdsloader.plan.resume import Resume

__all__ = ["Planner", "SinglePlanner"]


@runtime_checkable
class Planner(Protocol):
    """Which split-wide sample ids a loader's ranks and workers yield, epoch by epoch: the same
    answers in every process (a planner travels to the workers inside the dataset)."""

    def num_batches(self, epoch: int, resume: Resume | None = None) -> int:
        """Batches every rank yields in ``epoch`` (from ``resume`` on)."""
        ...

    def padding(self, epoch: int) -> int:
        """Samples repeated in ``epoch`` so every rank gets the same batches."""
        ...

    def dropped(self, epoch: int) -> int:
        """Samples left out of ``epoch`` so every batch is full."""
        ...

    def worker_batches(
        self, epoch: int, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[np.ndarray]:
        """The split-wide sample ids of each batch DataLoader worker ``worker`` of ``rank``
        yields in ``epoch`` (from ``resume`` on), computed when indexed."""
        ...


@dataclass(frozen=True, slots=True)
class SinglePlanner:
    """The plan of one source: :mod:`wdsloader.plan`'s functions over ``config``."""

    config: PlanConfig

    def num_batches(self, epoch: int, resume: Resume | None = None) -> int:
        """Batches every rank yields in ``epoch`` (from ``resume`` on)."""
        return num_batches(self.config, epoch=epoch, resume=resume)

    def padding(self, epoch: int) -> int:
        """Samples repeated in ``epoch`` so every rank gets the same batches."""
        return epoch_padding(self.config, epoch=epoch)

    def dropped(self, epoch: int) -> int:
        """Samples left out of ``epoch`` so every batch is full."""
        return epoch_dropped(self.config, epoch=epoch)

    def worker_batches(
        self, epoch: int, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[np.ndarray]:
        """The batches of worker ``worker`` of ``rank`` (:func:`~wdsloader.plan.worker_batches`)."""
        return worker_batches(self.config, epoch, rank, worker, resume)
