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
from wdsloader.plan.partition import (
    Geometry,
    Positions,
    Runs,
    batches_before,
    geometry,
    window_perm,
    windowed,
)

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


@dataclass(frozen=True, slots=True, eq=False)
class _Leftover:
    """The part of a shuffle window a worker had not yielded: entries ``used ..`` of the yield
    order of chunk offsets ``[lo, hi)`` of plan worker ``worker`` of ``rank`` under ``cfg``,
    as sorted positions of the sequence that plan ran over (``start``: chunk offset 0)."""

    cfg: PlanConfig
    epoch: int
    rank: int
    worker: int
    n: int
    lo: int
    hi: int
    used: int
    start: int

    def members(self) -> np.ndarray:
        perm = window_perm(self.cfg, self.epoch, self.rank, self.worker, self.n, self.lo, self.hi)
        return np.sort(self.start + perm[self.used :])


@dataclass(frozen=True, slots=True, eq=False)
class Remaining:
    """What an elastic resume leaves of ``parent``, in ``parent``'s order: piece ``i`` holds this
    sequence's positions ``cum[i] .. cum[i + 1] - 1``, either a run of consecutive parent
    positions from ``starts[i]`` or (``starts[i] == -1``) the leftover of a shuffle window,
    whose members are drawn again when read (a few kept in ``cache``)."""

    parent: Positions
    cum: np.ndarray
    starts: np.ndarray
    leftovers: dict[int, _Leftover]
    cache: dict[int, np.ndarray]

    @property
    def size(self) -> int:
        """Length of the sequence."""
        return int(self.cum[-1])

    def _members(self, piece: int) -> np.ndarray:
        if piece not in self.cache:
            if len(self.cache) >= 16:
                self.cache.clear()
            self.cache[piece] = self.leftovers[piece].members()
        return self.cache[piece]

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The order positions at ``pos`` (int64 array, each in [0, size))."""
        piece = np.searchsorted(self.cum, pos, side="right") - 1
        local = pos - self.cum[piece]
        out = self.starts[piece] + local
        for p in np.unique(piece[self.starts[piece] < 0]):
            mask = piece == p
            out[mask] = self._members(int(p))[local[mask]]
        return self.parent.take(out)


def _windows(
    cfg: PlanConfig, epoch: int, g: Geometry, used: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[_Leftover], np.ndarray]:
    """Per rank and plan worker, the start and end of the chunk positions consumed as one
    interval; the leftovers of partly yielded windows; the positions consumed one by one (in
    windows that padding reaches twice)."""
    w = cfg.window if windowed(cfg) else 1
    full = (used // w) * w
    wend = np.minimum(g.chunk_len, full + w)
    pad = 0 if cfg.drop_last else cfg.world_size * g.per_rank - g.size
    q0 = (np.arange(cfg.world_size, dtype=np.int64)[:, None] * g.per_rank + g.chunk_start).ravel()
    hi = q0 + np.tile(full, cfg.world_size)
    points, leftovers = [], []
    for p in np.flatnonzero(used > full):  # a window partly yielded
        n, a, b, u = int(g.chunk_len[p]), int(full[p]), int(wend[p]), int(used[p])
        for rank in range(cfg.world_size):
            start = rank * g.per_rank + int(g.chunk_start[p])
            if start + a >= pad and start + b <= g.size:  # no position reached twice (padding)
                hi[rank * cfg.num_workers + p] = start + b
                leftovers.append(_Leftover(cfg, epoch, rank, int(p), n, a, b, u - a, start))
            else:
                local = window_perm(cfg, epoch, rank, int(p), n, a, u)
                points.append((start + local + g.rot) % g.size)
    pts = np.concatenate(points) if points else np.zeros(0, np.int64)
    return q0, hi, leftovers, pts


def _remaining(cfg: PlanConfig, epoch: int, base: Positions, k: int) -> Positions:
    """``base`` without the samples of the first ``k`` batches of every rank under ``cfg``."""
    g = geometry(cfg, epoch, base.size)
    if k > g.batches:
        raise ValueError(
            f"batches_done={k} exceeds the {g.batches} batches per rank of {describe(cfg)}"
        )
    if k == 0 or g.size == 0:
        return base
    used = np.minimum(batches_before(k, cfg.num_workers) * cfg.batch_size, g.chunk_len)
    q_lo, q_hi, leftovers, pts = _windows(cfg, epoch, g, used)
    lo, hi = _to_source(q_lo, q_hi, g.rot, g.size)
    lo, hi = np.concatenate([lo, pts]), np.concatenate([hi, pts + 1])
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    gap_lo = np.concatenate([np.zeros(1, np.int64), hi])
    gap_hi = np.concatenate([lo, np.array([g.size], np.int64)])
    keep = gap_hi > gap_lo
    gap_lo, gap_hi = gap_lo[keep], gap_hi[keep]
    if not leftovers and isinstance(base, Runs):
        return base.restrict(gap_lo, gap_hi)
    starts = np.concatenate([gap_lo, [x.start + x.lo for x in leftovers]]).astype(np.int64)
    lengths = np.concatenate([gap_hi - gap_lo, [x.hi - x.lo - x.used for x in leftovers]])
    is_run = np.concatenate([np.ones(gap_lo.size, bool), np.zeros(len(leftovers), bool)])
    by_start = np.argsort(starts, kind="stable")
    cum = np.zeros(by_start.size + 1, np.int64)
    np.cumsum(lengths[by_start].astype(np.int64), out=cum[1:])
    kept = {
        int(i): leftovers[int(j) - gap_lo.size] for i, j in enumerate(by_start) if j >= gap_lo.size
    }
    return Remaining(base, cum, np.where(is_run[by_start], starts[by_start], -1), kept, {})


def _check_compatible(cfg: PlanConfig, saved: PlanConfig) -> None:
    for name in ("counts", "seed", "shuffle", "span"):
        if getattr(cfg, name) != getattr(saved, name):
            raise ValueError(
                f"cannot resume: {name} differs between the saved plan ({getattr(saved, name)!r}) "
                f"and this one ({getattr(cfg, name)!r}); only world_size, num_workers, batch_size, "
                "drop_last and window may change"
            )


def _base_after(cfg: PlanConfig, epoch: int, resume: Resume | None) -> Positions:
    """The epoch's order positions left once ``resume`` has been consumed."""
    if resume is None:
        return Runs.identity(cfg.num_samples)
    _check_compatible(cfg, resume.config)
    base = _base_after(cfg, epoch, resume.prior)
    return _remaining(resume.config, epoch, base, resume.batches_done)


def resolve(cfg: PlanConfig, epoch: int, resume: Resume | None) -> tuple[Positions, Geometry, int]:
    """The order positions the plan of ``cfg`` runs over, its geometry, and the batches to skip
    (cached: the ranks and workers of one process share the work of an elastic re-plan)."""
    return _resolve(cfg, as_int(epoch, "epoch", 0), resume)


@functools.lru_cache(maxsize=8)
def _resolve(cfg: PlanConfig, epoch: int, resume: Resume | None) -> tuple[Positions, Geometry, int]:
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
