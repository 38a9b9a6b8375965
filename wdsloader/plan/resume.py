"""Resume: where an epoch stopped (:class:`Resume`), and the sequence of order positions a plan
runs over once the batches of earlier runs of the epoch are taken out.

With the same config the rest of the epoch is reproduced exactly (the plan skips the batches
done); with another topology the samples not yet consumed are planned afresh for the new config
(elastic resume). A resume is a few numbers per run: nothing lists samples.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.config import PlanConfig, describe
from wdsloader.plan.partition import Geometry, Runs, batches_before, geometry, window_perm, windowed

__all__ = ["Resume", "next_resume", "resolve"]


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an epoch stopped: the config in force and the batches every rank had yielded.

    ``batches_done`` counts the batches yielded since the plan of ``config`` started: the start of the
    epoch, or, when that run had itself resumed elastically (with another config), that resume, which
    is then ``prior``. :func:`next_resume` builds the right state; ``prior`` never has ``config``'s
    config (an exact resume keeps counting instead).
    """

    config: PlanConfig
    batches_done: int
    prior: Resume | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, PlanConfig):
            raise ValueError(
                f"Resume.config must be a PlanConfig, got {type(self.config).__name__}"
            )
        object.__setattr__(self, "batches_done", as_int(self.batches_done, "batches_done", 0))
        if self.prior is not None:
            if not isinstance(self.prior, Resume):
                raise ValueError(f"Resume.prior must be a Resume, got {type(self.prior).__name__}")
            if self.prior.config == self.config:
                raise ValueError(
                    "Resume.prior has the same config as the resume itself; an exact resume keeps "
                    "counting batches_done instead (use next_resume)"
                )


def next_resume(cfg: PlanConfig, resumed_from: Resume | None, batches_yielded: int) -> Resume:
    """The state to save after a run under ``cfg`` yielded ``batches_yielded`` batches on every rank.

    ``resumed_from`` is the state this run started from (None for a run from the epoch's start).
    """
    batches_yielded = as_int(batches_yielded, "batches_yielded", 0)
    if resumed_from is None:
        return Resume(cfg, batches_yielded)
    if resumed_from.config == cfg:
        return Resume(cfg, resumed_from.batches_done + batches_yielded, resumed_from.prior)
    return Resume(cfg, batches_yielded, resumed_from)


def _to_source(
    q_lo: np.ndarray, q_hi: np.ndarray, rot: int, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of positions ``[q_lo, q_hi)`` (each at most ``size`` long) as source intervals."""
    keep = q_hi > q_lo
    q_lo, q_hi = q_lo[keep], q_hi[keep]
    lo = (q_lo + rot) % size
    hi = lo + (q_hi - q_lo)
    wraps = hi > size
    return (
        np.concatenate([lo, np.zeros(int(wraps.sum()), np.int64)]),
        np.concatenate([np.minimum(hi, size), hi[wraps] - size]),
    )


def _remaining(cfg: PlanConfig, epoch: int, base: Runs, k: int) -> Runs:
    """``base`` without the samples of the first ``k`` batches of every rank under ``cfg``."""
    g = geometry(cfg, epoch, base.size)
    if k > g.batches:
        raise ValueError(
            f"batches_done={k} exceeds the {g.batches} batches per rank of {describe(cfg)}"
        )
    if k == 0 or g.size == 0:
        return base
    used = np.minimum(batches_before(k, cfg.num_workers) * cfg.batch_size, g.chunk_len)
    full = (used // cfg.window) * cfg.window if windowed(cfg) else used
    rank_start = np.arange(cfg.world_size, dtype=np.int64)[:, None] * g.per_rank
    q_lo = (rank_start + g.chunk_start[None, :]).ravel()
    lo, hi = _to_source(q_lo, q_lo + np.tile(full, cfg.world_size), g.rot, g.size)
    points = []
    for p in np.flatnonzero(used > full):  # the part of a window a worker had yielded
        n, a, b = int(g.chunk_len[p]), int(full[p]), int(used[p])
        for rank in range(cfg.world_size):
            local = window_perm(cfg, epoch, rank, int(p), n, a, b)
            points.append((rank * g.per_rank + g.chunk_start[p] + local + g.rot) % g.size)
    pts = np.concatenate(points) if points else np.zeros(0, np.int64)
    lo, hi = np.concatenate([lo, pts]), np.concatenate([hi, pts + 1])
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    gap_lo = np.concatenate([np.zeros(1, np.int64), hi])
    gap_hi = np.concatenate([lo, np.array([g.size], np.int64)])
    keep = gap_hi > gap_lo
    return base.restrict(gap_lo[keep], gap_hi[keep])


def _check_compatible(cfg: PlanConfig, saved: PlanConfig) -> None:
    for name in ("counts", "seed", "shuffle", "span"):
        if getattr(cfg, name) != getattr(saved, name):
            raise ValueError(
                f"cannot resume: {name} differs between the saved plan ({getattr(saved, name)!r}) "
                f"and this one ({getattr(cfg, name)!r}); only world_size, num_workers, batch_size, "
                "drop_last and window may change"
            )


def _base_after(cfg: PlanConfig, epoch: int, resume: Resume | None) -> Runs:
    """The epoch's order positions left once ``resume`` has been consumed."""
    if resume is None:
        return Runs.identity(cfg.num_samples)
    _check_compatible(cfg, resume.config)
    base = _base_after(cfg, epoch, resume.prior)
    return _remaining(resume.config, epoch, base, resume.batches_done)


def resolve(cfg: PlanConfig, epoch: int, resume: Resume | None) -> tuple[Runs, Geometry, int]:
    """The order positions the plan of ``cfg`` runs over, its geometry, and the batches to skip
    (cached: the ranks and workers of one process share the work of an elastic re-plan)."""
    return _resolve(cfg, as_int(epoch, "epoch", 0), resume)


@functools.lru_cache(maxsize=8)
def _resolve(cfg: PlanConfig, epoch: int, resume: Resume | None) -> tuple[Runs, Geometry, int]:
    if resume is not None and resume.config == cfg:
        base, skip = _base_after(cfg, epoch, resume.prior), resume.batches_done
    else:
        base, skip = _base_after(cfg, epoch, resume), 0
    g = geometry(cfg, epoch, base.size)
    if skip > g.batches:
        raise ValueError(
            f"batches_done={skip} exceeds the {g.batches} batches per rank of {describe(cfg)}"
        )
    return base, g, skip
