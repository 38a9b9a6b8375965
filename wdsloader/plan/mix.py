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
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.quotas import largest_remainder

__all__ = [
    "Batch",
    "MixEpoch",
    "MixTopology",
    "epoch_offsets",
    "keyed_permutation",
    "mix_num_batches",
    "mix_rank_batches",
    "mix_worker_batches",
    "mixed_layout",
    "source_ids",
]


# ------------------------------------------------------------------------ keyed permutation

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROUNDS = 6


def _key(*parts: int) -> np.ndarray:
    """Round keys (uint64) from integer parts, the same on every platform."""
    keys: np.ndarray = np.random.SeedSequence([*parts]).generate_state(_ROUNDS, np.uint64)
    return keys


def _mix64(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def keyed_permutation(n: int, keys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A bijection of ``[0, n)`` chosen by ``keys``, evaluated at ``x`` (int64, each in
    ``[0, n)``): a balanced Feistel network over the smallest even bit width holding ``n``,
    repeated on values that leave ``[0, n)`` (cycle walking)."""
    x = np.asarray(x, dtype=np.int64)
    if n <= 1:
        same: np.ndarray = x.copy()
        return same
    bits = max(2, (n - 1).bit_length())
    half = np.uint64((bits + 1) // 2)
    mask = np.uint64((1 << int(half)) - 1)
    y = x.astype(np.uint64)
    todo = np.arange(y.size)
    while todo.size:
        v = y[todo]
        left, right = v >> half, v & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        v = (left << half) | right
        y[todo] = v
        todo = todo[v >= np.uint64(n)]
    return y.astype(np.int64)


# ----------------------------------------------------------------------------------- stream


def source_ids(size: int, block: int, keys: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Sample ids (within the source) at positions ``stream`` of the source's stream.

    The stream cycles through one order of the source: its blocks of ``block`` consecutive ids
    in a keyed order, then the short block that ``size`` leaves, if any. So any ``size``
    consecutive stream positions hold every sample once, any fewer hold no sample twice, and
    ``k * size + r`` consecutive ones hold each sample ``k`` or ``k + 1`` times.
    """
    i: np.ndarray = np.asarray(stream, dtype=np.int64) % size
    whole = size // block
    out: np.ndarray = i.copy()
    inside = i < whole * block
    j = i[inside]
    out[inside] = keyed_permutation(whole, keys, j // block) * block + j % block
    return out


# ----------------------------------------------------------------------------------- epochs

_SOURCE_TAG = 0x5043_5EED
_BLOCK_TAG = 0xB10C_5EED
_STRAT_TAG = 0x57A7_5EED


@dataclass(frozen=True, slots=True, kw_only=True)
class MixEpoch:
    """One epoch of a mix: per source its size, its quota this epoch and the stream positions
    earlier epochs consumed (the sum of its earlier quotas); ``block`` consecutive samples of a
    source stay together in the order (the read span)."""

    sizes: tuple[int, ...]
    quotas: tuple[int, ...]
    offsets: tuple[int, ...]
    seed: int = 0
    epoch: int = 0
    block: int = 1

    def __post_init__(self) -> None:
        n = len(self.sizes)
        if n == 0 or len(self.quotas) != n or len(self.offsets) != n:
            raise ValueError(
                f"sizes, quotas and offsets need one entry per source, got {n}, "
                f"{len(self.quotas)} and {len(self.offsets)}"
            )
        for name in ("sizes", "quotas", "offsets"):
            values = tuple(as_int(v, f"{name}[{i}]", 0) for i, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        for name, low in (("seed", 0), ("epoch", 0), ("block", 1)):
            object.__setattr__(self, name, as_int(getattr(self, name), name, low))
        empty = [i for i in range(n) if self.sizes[i] == 0 and self.quotas[i] > 0]
        if empty:
            raise ValueError(f"sources {empty} have no samples but a quota")

    @property
    def length(self) -> int:
        """Samples in the epoch (the sum of the quotas)."""
        return sum(self.quotas)


def epoch_offsets(quotas_by_epoch: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Stream positions each source consumed over the given (earlier) epochs."""
    if not quotas_by_epoch:
        raise ValueError("epoch_offsets needs the quotas of at least one epoch")
    total = np.sum(np.asarray(quotas_by_epoch, dtype=np.int64), axis=0)
    return tuple(int(v) for v in total)


def _to_ids(me: MixEpoch, src: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Sample ids of the ``k``-th epoch samples of sources ``src``."""
    ids = np.empty(src.size, dtype=np.int64)
    for s in np.unique(src).tolist():
        sel = src == s
        keys = _key(me.seed, s, _SOURCE_TAG)
        ids[sel] = source_ids(me.sizes[s], me.block, keys, me.offsets[s] + k[sel])
    return ids


def mixed_layout(me: MixEpoch, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(source, sample id)`` at ``positions`` of the epoch's mixed order (int64 arrays).

    Each source's epoch samples are cut into blocks of ``block`` stream positions; the short
    blocks open the epoch (in source order), the whole blocks of all sources follow in an order
    keyed by (seed, epoch). Each position costs O(1), nothing is built per epoch sample.
    """
    pos = np.asarray(positions, dtype=np.int64)
    q = np.asarray(me.quotas, dtype=np.int64)
    b = me.block
    whole, short = q // b, q % b
    short_start = np.cumsum(short) - short
    whole_start = np.cumsum(whole) - whole
    n_short = int(short.sum())
    src = np.empty(pos.size, dtype=np.int64)
    k = np.empty(pos.size, dtype=np.int64)
    head = pos < n_short
    s = np.searchsorted(short_start, pos[head], side="right") - 1
    src[head], k[head] = s, whole[s] * b + pos[head] - short_start[s]
    rest = pos[~head] - n_short
    blocks = keyed_permutation(int(whole.sum()), _key(me.seed, me.epoch, _BLOCK_TAG), rest // b)
    s = np.searchsorted(whole_start, blocks, side="right") - 1
    src[~head], k[~head] = s, (blocks - whole_start[s]) * b + rest % b
    return src, _to_ids(me, src, k)


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


def _virtual(me: MixEpoch, topo: MixTopology) -> Any:
    """The single-source plan over the epoch's positions (what deals the mixed order)."""
    from wdsloader.plan import PlanConfig

    return PlanConfig(
        counts=(me.length,), batch_size=topo.batch_size, world_size=topo.world_size,
        num_workers=topo.num_workers, seed=me.seed, shuffle=True, drop_last=topo.drop_last,
        span=max(me.length, 1), window=topo.window,
    )  # fmt: skip


Batch = tuple[np.ndarray, np.ndarray]  # (source, sample id) of each sample of a batch


def mix_num_batches(me: MixEpoch, topo: MixTopology) -> int:
    """Batches every rank yields in the epoch (the same on every rank)."""
    if topo.batching == "mixed":
        from wdsloader.plan import num_batches

        return int(num_batches(_virtual(me, topo), epoch=me.epoch))
    return _strata(me, topo).batches


def mix_worker_batches(
    me: MixEpoch, topo: MixTopology, rank: int, worker: int, batches_done: int = 0
) -> list[Batch]:
    """The batches DataLoader worker ``worker`` of ``rank`` yields once its rank has yielded
    ``batches_done``: rank batches ``batches_done + worker``, then every ``num_workers``-th
    (torch's round-robin over workers, as :func:`~wdsloader.plan.worker_batches`)."""
    rank = as_int(rank, "rank", 0, topo.world_size - 1)
    worker = as_int(worker, "worker", 0, topo.num_workers - 1)
    done = as_int(batches_done, "batches_done", 0)
    if topo.batching == "mixed":
        from wdsloader.plan import Resume, worker_batches

        cfg = _virtual(me, topo)
        resume = Resume(cfg, done) if done else None
        return [
            mixed_layout(me, pos) for pos in worker_batches(cfg, me.epoch, rank, worker, resume)
        ]
    strata = _strata(me, topo)
    first = done + worker
    return [
        strata.rank_batch(me, topo, t, rank) for t in range(first, strata.batches, topo.num_workers)
    ]


def mix_rank_batches(me: MixEpoch, topo: MixTopology, rank: int) -> list[Batch]:
    """All batches of ``rank`` in the order its DataLoader yields them."""
    lists = [mix_worker_batches(me, topo, rank, w) for w in range(topo.num_workers)]
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

    def rank_batch(self, me: MixEpoch, topo: MixTopology, t: int, rank: int) -> Batch:
        counts = self.counts(t)
        size = int(counts.sum())
        per = topo.batch_size if t < self.full else -(-size // topo.world_size)
        pos = (rank * per + np.arange(per, dtype=np.int64)) % size
        pos = keyed_permutation(size, _key(me.seed, me.epoch, t, _STRAT_TAG), pos)
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
