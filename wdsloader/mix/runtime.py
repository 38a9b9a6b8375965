"""What a loader over a sample-level mix adds to the single-source one: the mix plan's answers
for a rank (:class:`MixPlanner`) and each sample's source (:class:`SourceTags`: the optional batch
field and the per-source counters shared with the main process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from wdsloader.mix.spec import MixSpec
from wdsloader.plan import PlanConfig, Resume
from wdsloader.plan.mix import (
    GlobalIds,
    MixEpoch,
    MixTopology,
    mix_dropped,
    mix_num_batches,
    mix_padding,
    mix_worker_batches,
)

__all__ = ["MixPlanner", "SourceTags"]


class MixPlanner:
    """The mix plan of ``spec`` dealt by ``config``'s topology (the loader's plan over the
    sources' shards concatenated): its seed, its ``span`` as the mix's block, its window, and
    the spec's batching strategy (resolved here, so it travels into workers with the planner).
    A :class:`~wdsloader.plan.Planner`."""

    def __init__(self, spec: MixSpec, config: PlanConfig) -> None:
        self.spec, self.config = spec, config
        self.offsets = spec.offsets
        self.topology = MixTopology(
            batch_size=config.batch_size, world_size=config.world_size,
            num_workers=config.num_workers, drop_last=config.drop_last, window=config.window,
            batching=spec.batching,
        )  # fmt: skip

    def _epoch(self, epoch: int) -> MixEpoch:
        return self.spec.epoch(epoch, seed=self.config.seed, block=self.config.span)

    def num_batches(self, epoch: int, resume: Resume | None = None) -> int:
        """Batches every rank yields in ``epoch`` (from ``resume`` on)."""
        return mix_num_batches(self._epoch(epoch), self.topology, resume)

    def padding(self, epoch: int) -> int:
        """Samples repeated in ``epoch`` so every rank gets the same batches."""
        return mix_padding(self._epoch(epoch), self.topology)

    def dropped(self, epoch: int) -> int:
        """Samples of ``epoch``'s quotas left out so every batch is full."""
        return mix_dropped(self._epoch(epoch), self.topology)

    def worker_batches(
        self, epoch: int, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[np.ndarray]:
        """The split-wide sample ids of each batch DataLoader worker ``worker`` of ``rank``
        yields (computed when indexed)."""
        batches = mix_worker_batches(self._epoch(epoch), self.topology, rank, worker, resume)
        return GlobalIds(batches, self.offsets)


class SourceTags:
    """Each sample's source (its index in the list): from the shard it was read from, put in
    the batch field ``spec.source_field`` when there is one, and counted per worker and source
    in shared memory (so persistent workers' counts reach the main process)."""

    KEY = "\0source"  # a decoded sample's source index, until it is counted (and maybe renamed)

    def __init__(self, spec: MixSpec, num_workers: int) -> None:
        self.names, self.field = spec.names, spec.source_field
        self.shard_source = spec.shard_source()
        self._counts = torch.zeros((max(1, num_workers), len(self.names)), dtype=torch.int64)
        self._counts.share_memory_()

    def of(self, shards: np.ndarray) -> np.ndarray:
        """The source of each sample read from ``shards`` (indexes in the split)."""
        out: np.ndarray = self.shard_source[np.asarray(shards, dtype=np.int64)]
        return out

    def tag_columns(self, columns: dict[str, Any], src: np.ndarray) -> None:
        """Put the source field in a batch held as columns (when there is one)."""
        if self.field is not None:
            columns[self.field] = src

    def take(self, samples: list[dict[str, Any]]) -> np.ndarray:
        """The sources the samples carry under :attr:`KEY`, moved to the source field when
        there is one (dropped otherwise)."""
        src = np.asarray([sample.pop(self.KEY) for sample in samples], dtype=np.int64)
        if self.field is not None:
            for sample, index in zip(samples, src.tolist(), strict=True):
                sample[self.field] = index
        return src

    def count(self, worker: int, src: np.ndarray) -> None:
        """Count the samples of ``src`` (their sources) as yielded by ``worker``."""
        row = self._counts.numpy()[worker]  # a view: no torch dispatch per batch
        row += np.bincount(src, minlength=row.size)

    def counters(self) -> dict[str, int]:
        """``samples/<name>``: samples of each source, summed over workers."""
        totals = self._counts.sum(dim=0).tolist()
        return {f"samples/{n}": v for n, v in zip(self.names, totals, strict=True)}
