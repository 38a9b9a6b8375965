"""The sample plan: which sample ids each DDP rank and each DataLoader worker yields, in which order.

Pure numpy functions, no I/O and no global random state: the same inputs give the same plan on every
process. A sample's global id is its position in the concatenation of the split's shards in manifest
order. The global work happens at span granularity (O(#spans)); sample ids are materialised only for
the rank or worker asked for.

An epoch is planned in three steps:

1. Epoch order: shards cut into spans of ``span`` consecutive samples, all spans permuted by
   (seed, epoch) (or ids in shard order when not shuffling).
2. Ranks: equal contiguous ranges of that order, after dropping its tail (``drop_last``) or padding it
   by wrapping around to its start.
3. Workers: each DataLoader worker of a rank takes one contiguous, batch-aligned chunk of the rank's
   range, shuffles it within windows of ``window`` samples, and cuts it into batches; rank batch ``j`` is
   the ``j // num_workers``-th batch of worker ``j % num_workers``, the order in which torch's
   DataLoader round-robins over its workers.

Resume: a :class:`Resume` names the config in force and the batches every rank had yielded. With the
same config the rest of the epoch is reproduced exactly; with another topology the samples not yet
consumed are planned afresh for the new config (elastic resume).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from wdsloader.format.checks import as_int

__all__ = [
    "PLAN_ALGORITHM",
    "PlanConfig",
    "Resume",
    "epoch_dropped",
    "epoch_order",
    "epoch_padding",
    "interleave",
    "next_resume",
    "num_batches",
    "rank_batches",
    "shard_of",
    "worker_batches",
]

# The plan algorithm's name and version, recorded in every loader state: bump the version whenever
# the same PlanConfig, epoch, rank and worker would yield other sample ids (a state saved under
# another version is then refused instead of resuming onto other samples).
PLAN_ALGORITHM: tuple[str, int] = ("span-permutation", 1)

# Constant tags mixed into the seed sequences so that the streams of the different steps never coincide.
# Changing one changes every plan: they are part of the resume contract.
_ORDER_TAG = 0x0DE5_5EED
_WINDOW_TAG = 0x3A1D_5EED


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """Everything the plan depends on except epoch, rank and worker (the same on every rank).

    ``counts`` are the samples per shard in manifest order; ``num_workers`` counts plan workers (at
    least 1: a DataLoader with ``num_workers=0`` is one worker); ``span`` consecutive samples of a shard
    stay together when shuffling; ``window`` is the per-worker shuffle window in samples (0 or 1: none).
    """

    counts: tuple[int, ...]
    batch_size: int
    world_size: int = 1
    num_workers: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    span: int = 1
    window: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.counts, (str, bytes, dict)) or not hasattr(self.counts, "__iter__"):
            raise ValueError(
                f"counts must be a sequence of per-shard sample counts, got {self.counts!r}"
            )
        counts = tuple(as_int(c, f"counts[{i}]", 0) for i, c in enumerate(self.counts))
        object.__setattr__(self, "counts", counts)
        for name in ("batch_size", "world_size", "num_workers", "span"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 1))
        for name in ("seed", "window"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 0))
        for name in ("shuffle", "drop_last"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))

    @property
    def num_samples(self) -> int:
        """Samples in the split (sum of ``counts``)."""
        return sum(self.counts)


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


# --------------------------------------------------------------------------------------- runs


@dataclass(frozen=True, slots=True)
class _Runs:
    """An integer sequence stored as back-to-back runs of consecutive values.

    Run ``i`` holds ``starts[i], starts[i] + 1, ...`` at positions ``cum[i] .. cum[i + 1] - 1``.
    """

    starts: np.ndarray
    cum: np.ndarray

    @staticmethod
    def build(starts: np.ndarray, lengths: np.ndarray) -> _Runs:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        keep = lengths > 0
        starts, lengths = starts[keep], lengths[keep]
        if starts.size > 1:  # merge runs that continue one another
            heads = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1]) + 1
            heads = np.concatenate([np.zeros(1, np.int64), heads])
            starts, lengths = starts[heads], np.add.reduceat(lengths, heads)
        cum = np.zeros(starts.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=cum[1:])
        return _Runs(starts, cum)

    @property
    def size(self) -> int:
        return int(self.cum[-1])

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The values at positions ``pos`` (int64 array, each in [0, size))."""
        out: np.ndarray
        if self.starts.size == 1:
            out = pos + self.starts[0]
            return out
        run = np.searchsorted(self.cum, pos, side="right") - 1
        out = self.starts[run] + (pos - self.cum[run])
        return out

    def expand(self) -> np.ndarray:
        """The whole sequence as an int64 array."""
        lengths = np.diff(self.cum)
        return np.repeat(self.starts - self.cum[:-1], lengths) + np.arange(
            self.size, dtype=np.int64
        )

    def restrict(self, lo: np.ndarray, hi: np.ndarray) -> _Runs:
        """The subsequence at the positions of the sorted, disjoint intervals ``[lo[i], hi[i])``."""
        if lo.size == 0:
            return _Runs.build(np.zeros(0, np.int64), np.zeros(0, np.int64))
        cuts = np.union1d(np.concatenate([lo, hi]), self.cum)
        seg_lo, seg_hi = cuts[:-1], cuts[1:]
        owner = np.searchsorted(lo, seg_lo, side="right") - 1
        keep = (owner >= 0) & (seg_hi <= hi[np.maximum(owner, 0)])
        seg_lo, seg_hi = seg_lo[keep], seg_hi[keep]
        return _Runs.build(self.take(seg_lo), seg_hi - seg_lo)


def _identity(n: int) -> _Runs:
    return _Runs.build(np.zeros(1, np.int64), np.array([n], np.int64))


def _span_runs(cfg: PlanConfig, epoch: int) -> _Runs:
    """Order position -> global id for the epoch (step 1), one run per span."""
    n = cfg.num_samples
    if not cfg.shuffle:
        return _identity(n)
    counts = np.asarray(cfg.counts, dtype=np.int64)
    per_shard = -(-counts // cfg.span)
    shard = np.repeat(np.arange(counts.size), per_shard)
    first_span = np.cumsum(per_shard) - per_shard
    shard_start = np.cumsum(counts) - counts
    local = (np.arange(shard.size, dtype=np.int64) - first_span[shard]) * cfg.span
    starts = shard_start[shard] + local
    lengths = np.minimum(cfg.span, counts[shard] - local)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, epoch, _ORDER_TAG]))
    perm = rng.permutation(shard.size)
    return _Runs.build(starts[perm], lengths[perm])


# ------------------------------------------------------------------------------------ geometry


@dataclass(frozen=True, slots=True)
class _Geometry:
    """Steps 2-3 for a sequence of ``size`` samples: rank ranges and per-worker chunks.

    Position ``q`` of the (truncated or padded) sequence is index ``(q + rot) % size`` of the source
    sequence; rank ``r`` owns ``[r * per_rank, (r + 1) * per_rank)``; plan worker ``p`` owns the
    rank-local chunk ``[chunk_start[p], chunk_start[p] + chunk_len[p])`` holding ``n_batches[p]``
    batches.
    """

    size: int
    per_rank: int
    batches: int
    rot: int
    chunk_start: np.ndarray
    chunk_len: np.ndarray
    n_batches: np.ndarray


def _geometry(cfg: PlanConfig, epoch: int, size: int) -> _Geometry:
    world, bsz, nw = cfg.world_size, cfg.batch_size, cfg.num_workers
    rot = 0
    if cfg.drop_last:
        per_rank = (size // (world * bsz)) * bsz
        if not cfg.shuffle and size:
            rot = (epoch * (size - world * per_rank)) % size
    else:
        per_rank = -(-size // world)
    nb = -(-per_rank // bsz)
    workers = np.arange(nw, dtype=np.int64)
    n_batches = np.maximum(0, -(-(nb - workers) // nw))
    chunk_len = n_batches * bsz
    chunk_start = np.zeros(nw, dtype=np.int64)
    if nb:
        last = (nb - 1) % nw  # yields the final, possibly partial, batch: its chunk is the tail
        chunk_len[last] -= nb * bsz - per_rank
        layout = (last + 1 + workers) % nw
        chunk_start[layout] = np.cumsum(chunk_len[layout]) - chunk_len[layout]
    return _Geometry(size, per_rank, nb, rot, chunk_start, chunk_len, n_batches)


def _batches_before(k: int, nw: int) -> np.ndarray:
    """Batches each plan worker has yielded once its rank has yielded ``k``."""
    return np.maximum(0, -(-(k - np.arange(nw, dtype=np.int64)) // nw))


def _window_rng(cfg: PlanConfig, epoch: int, rank: int, worker: int) -> np.random.Generator:
    return np.random.default_rng(
        np.random.SeedSequence([cfg.seed, epoch, rank, worker, _WINDOW_TAG])
    )


def _windowed(cfg: PlanConfig) -> bool:
    return cfg.shuffle and cfg.window > 1


def _window_perm(cfg: PlanConfig, epoch: int, rank: int, worker: int, n: int) -> np.ndarray:
    """Yield order of a chunk of ``n`` samples: a permutation within each window of ``window``."""
    if not _windowed(cfg) or n <= 1:
        return np.arange(n, dtype=np.int64)
    w = cfg.window
    keys = _window_rng(cfg, epoch, rank, worker).random(n)
    full = (n // w) * w
    perm = np.empty(n, dtype=np.int64)
    if full:
        inner = np.argsort(keys[:full].reshape(-1, w), axis=1, kind="stable")
        perm[:full] = (inner + np.arange(0, full, w, dtype=np.int64)[:, None]).ravel()
    if full < n:
        perm[full:] = full + np.argsort(keys[full:], kind="stable")
    return perm


def _one_window_perm(
    cfg: PlanConfig, epoch: int, rank: int, worker: int, n: int, i: int
) -> np.ndarray:
    """Window ``i`` of :func:`_window_perm` (window-local offsets) without drawing the others."""
    w = cfg.window
    rng = _window_rng(cfg, epoch, rank, worker)
    cast(np.random.PCG64, rng.bit_generator).advance(i * w)  # one 64-bit draw per float64 key
    return np.argsort(rng.random(min(w, n - i * w)), kind="stable")


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


def _remaining(cfg: PlanConfig, epoch: int, base: _Runs, k: int) -> _Runs:
    """``base`` without the samples of the first ``k`` batches of every rank under ``cfg``."""
    g = _geometry(cfg, epoch, base.size)
    if k > g.batches:
        raise ValueError(
            f"batches_done={k} exceeds the {g.batches} batches per rank of {_describe(cfg)}"
        )
    if k == 0 or g.size == 0:
        return base
    used = np.minimum(_batches_before(k, cfg.num_workers) * cfg.batch_size, g.chunk_len)
    full = (used // cfg.window) * cfg.window if _windowed(cfg) else used
    rank_start = np.arange(cfg.world_size, dtype=np.int64)[:, None] * g.per_rank
    q_lo = (rank_start + g.chunk_start[None, :]).ravel()
    lo, hi = _to_source(q_lo, q_lo + np.tile(full, cfg.world_size), g.rot, g.size)
    points = []
    for p in np.flatnonzero(used > full):
        i = int(full[p]) // cfg.window
        for rank in range(cfg.world_size):
            local = _one_window_perm(cfg, epoch, rank, int(p), int(g.chunk_len[p]), i)
            q = rank * g.per_rank + g.chunk_start[p] + full[p] + local[: used[p] - full[p]]
            points.append((q + g.rot) % g.size)
    pts = np.concatenate(points) if points else np.zeros(0, np.int64)
    lo, hi = np.concatenate([lo, pts]), np.concatenate([hi, pts + 1])
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    gap_lo = np.concatenate([np.zeros(1, np.int64), hi])
    gap_hi = np.concatenate([lo, np.array([g.size], np.int64)])
    keep = gap_hi > gap_lo
    return base.restrict(gap_lo[keep], gap_hi[keep])


# ----------------------------------------------------------------------------------- resolving


def _describe(cfg: PlanConfig) -> str:
    return (
        f"the plan with {cfg.num_samples} samples, world_size={cfg.world_size}, "
        f"num_workers={cfg.num_workers}, batch_size={cfg.batch_size}, drop_last={cfg.drop_last}"
    )


def _check_epoch(epoch: int) -> int:
    return as_int(epoch, "epoch", 0)


def _check_compatible(cfg: PlanConfig, saved: PlanConfig) -> None:
    for name in ("counts", "seed", "shuffle", "span"):
        if getattr(cfg, name) != getattr(saved, name):
            raise ValueError(
                f"cannot resume: {name} differs between the saved plan ({getattr(saved, name)!r}) "
                f"and this one ({getattr(cfg, name)!r}); only world_size, num_workers, batch_size, "
                "drop_last and window may change"
            )


def _base_after(cfg: PlanConfig, epoch: int, resume: Resume | None) -> _Runs:
    """The epoch's source sequence (order positions) left once ``resume`` has been consumed."""
    if resume is None:
        return _identity(cfg.num_samples)
    _check_compatible(cfg, resume.config)
    base = _base_after(cfg, epoch, resume.prior)
    return _remaining(resume.config, epoch, base, resume.batches_done)


def _resolve(cfg: PlanConfig, epoch: int, resume: Resume | None) -> tuple[_Runs, _Geometry, int]:
    """The source sequence the plan of ``cfg`` runs over, its geometry, and the batches to skip."""
    epoch = _check_epoch(epoch)
    if resume is not None and resume.config == cfg:
        base, skip = _base_after(cfg, epoch, resume.prior), resume.batches_done
    else:
        base, skip = _base_after(cfg, epoch, resume), 0
    g = _geometry(cfg, epoch, base.size)
    if skip > g.batches:
        raise ValueError(
            f"batches_done={skip} exceeds the {g.batches} batches per rank of {_describe(cfg)}"
        )
    return base, g, skip


def _check_rank(cfg: PlanConfig, rank: int) -> int:
    rank = as_int(rank, "rank", 0)
    if rank >= cfg.world_size:
        raise ValueError(f"rank must be < world_size={cfg.world_size}, got {rank}")
    return rank


def _worker_ids(
    cfg: PlanConfig,
    epoch: int,
    rank: int,
    plan_worker: int,
    skip: int,
    base: _Runs,
    spans: _Runs,
    g: _Geometry,
) -> list[np.ndarray]:
    """Batches of plan worker ``plan_worker`` after its first ``skip`` batches."""
    n = int(g.chunk_len[plan_worker])
    order = _window_perm(cfg, epoch, rank, plan_worker, n)[skip * cfg.batch_size :]
    q = rank * g.per_rank + int(g.chunk_start[plan_worker]) + order
    if order.size == 0:
        return []
    ids = spans.take(base.take((q + g.rot) % g.size))
    return np.split(ids, np.arange(cfg.batch_size, ids.size, cfg.batch_size))


# -------------------------------------------------------------------------------------- public


def epoch_order(cfg: PlanConfig, epoch: int) -> np.ndarray:
    """The epoch's order of all global sample ids (int64), before any rank or worker split."""
    return _span_runs(cfg, _check_epoch(epoch)).expand()


def num_batches(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Batches every rank yields in the epoch (from ``resume`` on, when given); the same on all ranks."""
    _, g, skip = _resolve(cfg, epoch, resume)
    return g.batches - skip


def epoch_padding(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Samples delivered twice in the epoch to pad it (``drop_last=False``), over all ranks."""
    _, g, _ = _resolve(cfg, epoch, resume)
    return 0 if cfg.drop_last else cfg.world_size * g.per_rank - g.size


def epoch_dropped(cfg: PlanConfig, *, epoch: int = 0, resume: Resume | None = None) -> int:
    """Samples left out of the epoch so every rank gets whole batches (``drop_last=True``)."""
    _, g, _ = _resolve(cfg, epoch, resume)
    return g.size - cfg.world_size * g.per_rank if cfg.drop_last else 0


def worker_batches(
    cfg: PlanConfig, epoch: int, rank: int, worker: int, resume: Resume | None = None
) -> list[np.ndarray]:
    """The batches (int64 global ids) DataLoader worker ``worker`` of ``rank`` yields, in order.

    Without ``resume``, plan worker ``worker`` yields rank batches ``worker, worker + W, ...``. Resuming
    the same config after ``k`` batches, DataLoader worker ``i`` plays plan worker ``(k + i) % W`` and
    yields what it had not yet yielded, so the round-robin from worker 0 continues with rank batch ``k``.
    """
    rank = _check_rank(cfg, rank)
    worker = as_int(worker, "worker", 0)
    if worker >= cfg.num_workers:
        raise ValueError(f"worker must be < num_workers={cfg.num_workers}, got {worker}")
    base, g, skip = _resolve(cfg, epoch, resume)
    spans = _span_runs(cfg, epoch)
    plan_worker = (skip + worker) % cfg.num_workers
    done = int(_batches_before(skip, cfg.num_workers)[plan_worker])
    return _worker_ids(cfg, epoch, rank, plan_worker, done, base, spans, g)


def rank_batches(
    cfg: PlanConfig, epoch: int, rank: int, resume: Resume | None = None
) -> list[np.ndarray]:
    """The batches of ``rank`` in the order its DataLoader yields them (from ``resume`` on)."""
    rank = _check_rank(cfg, rank)
    base, g, skip = _resolve(cfg, epoch, resume)
    spans = _span_runs(cfg, epoch)
    nw = cfg.num_workers
    done = _batches_before(skip, nw)
    lists = []
    for worker in range(nw):
        p = (skip + worker) % nw
        lists.append(_worker_ids(cfg, epoch, rank, p, int(done[p]), base, spans, g))
    return interleave(lists)


def interleave(worker_lists: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """What a torch DataLoader returns from workers yielding these lists: round-robin from worker 0,
    skipping workers that are exhausted."""
    longest = max((len(lst) for lst in worker_lists), default=0)
    return [lst[j] for j in range(longest) for lst in worker_lists if j < len(lst)]


def shard_of(ids: np.ndarray, counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(shard index, index within that shard) of each global id, as int64 arrays."""
    ids = np.asarray(ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=offsets[1:])
    if ids.size and (ids.min() < 0 or ids.max() >= offsets[-1]):
        bad = ids[(ids < 0) | (ids >= offsets[-1])][0]
        raise ValueError(f"sample id {int(bad)} is outside [0, {int(offsets[-1])})")
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return shard, ids - offsets[shard]
