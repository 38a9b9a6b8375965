"""The plan's public answers: the batches of a rank or a DataLoader worker, and the epoch's
batch count, padding and dropped samples (from the start of the epoch or from a resume)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.config import PlanConfig
from wdsloader.plan.order import order_of
from wdsloader.plan.partition import WorkerBatches, batches_before
from wdsloader.plan.resume import Resume, resolve

__all__ = [
    "epoch_dropped",
    "epoch_padding",
    "interleave",
    "num_batches",
    "rank_batches",
    "worker_batches",
]


def num_batches(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Batches every rank yields in the epoch (from ``resume`` on, when given); the same on all ranks."""
    _, g, skip = resolve(cfg, epoch, resume)
    return g.batches - skip


def epoch_padding(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Samples delivered twice in the epoch to pad it (``drop_last=False``), over all ranks."""
    _, g, _ = resolve(cfg, epoch, resume)
    return 0 if cfg.drop_last else cfg.world_size * g.per_rank - g.size


def epoch_dropped(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Samples left out of the epoch so every rank gets whole batches (``drop_last=True``)."""
    _, g, _ = resolve(cfg, epoch, resume)
    return g.size - cfg.world_size * g.per_rank if cfg.drop_last else 0


def _check_rank(cfg: PlanConfig, rank: int) -> int:
    rank = as_int(rank, "rank", 0)
    if rank >= cfg.world_size:
        raise ValueError(f"rank must be < world_size={cfg.world_size}, got {rank}")
    return rank


def _worker_lists(
    cfg: PlanConfig, epoch: int, rank: int, resume: Resume | None, workers: Sequence[int]
) -> list[WorkerBatches]:
    base, g, skip = resolve(cfg, epoch, resume)
    order = order_of(cfg, epoch)
    done = batches_before(skip, cfg.num_workers)
    out = []
    for worker in workers:
        p = (skip + worker) % cfg.num_workers
        out.append(WorkerBatches(cfg, epoch, rank, p, int(done[p]), base=base, order=order, geom=g))
    return out


def worker_batches(
    cfg: PlanConfig, epoch: int, rank: int, worker: int, resume: Resume | None = None
) -> WorkerBatches:
    """The batches (int64 global ids) DataLoader worker ``worker`` of ``rank`` yields, in order;
    a sequence that computes a batch (or a slice of batches) when indexed.

    Without ``resume``, plan worker ``worker`` yields rank batches ``worker, worker + W, ...``. Resuming
    the same config after ``k`` batches, DataLoader worker ``i`` plays plan worker ``(k + i) % W`` and
    yields what it had not yet yielded, so the round-robin from worker 0 continues with rank batch ``k``.
    """
    rank = _check_rank(cfg, rank)
    worker = as_int(worker, "worker", 0)
    if worker >= cfg.num_workers:
        raise ValueError(f"worker must be < num_workers={cfg.num_workers}, got {worker}")
    return _worker_lists(cfg, epoch, rank, resume, [worker])[0]


def rank_batches(
    cfg: PlanConfig, epoch: int, rank: int, resume: Resume | None = None
) -> list[np.ndarray]:
    """The batches of ``rank`` in the order its DataLoader yields them (from ``resume`` on)."""
    rank = _check_rank(cfg, rank)
    lists = _worker_lists(cfg, epoch, rank, resume, range(cfg.num_workers))
    return interleave([lst[:] for lst in lists])


def interleave(worker_lists: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """What a torch DataLoader returns from workers yielding these lists: round-robin from worker 0,
    skipping workers that are exhausted."""
    longest = max((len(lst) for lst in worker_lists), default=0)
    return [lst[j] for j in range(longest) for lst in worker_lists if j < len(lst)]
