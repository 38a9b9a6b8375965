"""Step 1 of the plan, the epoch order: which global sample id sits at each position of the epoch.

Shards are cut into spans of ``span`` consecutive samples (the last span of a shard may be shorter),
and the spans are put in an order by a keyed bijection of span ids (:class:`KeyedPermutation`, a
Feistel network with cycle walking keyed by seed and epoch). Nothing proportional to the dataset is
built: :class:`EpochOrder` evaluates the bijection only at the positions asked for, and holds a few
arrays per shard (span and sample offsets, where the short spans landed) to turn an order position
into a global id. Without shuffling the order is the identity.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.config import ORDER_TAG, PlanConfig

__all__ = ["EpochOrder", "KeyedPermutation", "epoch_order", "order_of", "shard_of"]

ROUNDS = 12  # small domains need more rounds than the 4 of Luby-Rackoff to look uniform
# images computed together and kept (KeyedPermutation.images): one evaluation of the network
# costs about the same for 50 values as for 4,096 (its cycle walk's tail of small steps)
BLOCK = 4096
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class KeyedPermutation:
    """A bijection of ``[0, n)`` chosen by ``keys`` (one uint64 per Feistel round).

    A balanced Feistel network permutes the ``b``-bit integers (``b`` the smallest even width with
    ``2**b >= n``); a value that leaves ``[0, n)`` is permuted again until it comes back (cycle
    walking), which keeps the map a bijection of ``[0, n)``: fewer than 4 steps on average.
    """

    def __init__(self, n: int, keys: np.ndarray) -> None:
        self.n = as_int(n, "n", 0)
        bits = max(2, (self.n - 1).bit_length())
        self.half = np.uint64((bits + 1) // 2)
        self.mask = np.uint64((1 << int(self.half)) - 1)
        self.keys = np.asarray(keys, dtype=np.uint64)
        self._blocks: dict[int, np.ndarray] = {}  # the last few blocks of images (images())

    def _f(self, x: np.ndarray, key: np.uint64) -> np.ndarray:
        z = (x + key) * _GOLDEN  # splitmix64's finaliser of (x + key): every bit of x reaches all
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
        out: np.ndarray = z & self.mask
        return out

    def _encrypt(self, v: np.ndarray) -> np.ndarray:
        left, right = v >> self.half, v & self.mask
        for key in self.keys:
            left, right = right, left ^ self._f(right, key)
        out: np.ndarray = (left << self.half) | right
        return out

    def _decrypt(self, v: np.ndarray) -> np.ndarray:
        left, right = v >> self.half, v & self.mask
        for key in self.keys[::-1]:
            left, right = right ^ self._f(left, key), left
        out: np.ndarray = (left << self.half) | right
        return out

    def _walk(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        step = self._decrypt if inverse else self._encrypt
        v = step(np.asarray(x, dtype=np.uint64))
        out = np.flatnonzero(v >= np.uint64(self.n))
        while out.size:
            v[out] = step(v[out])
            out = out[v[out] >= np.uint64(self.n)]
        return v.astype(np.int64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The images of ``x`` (int64 values in ``[0, n)``)."""
        return self._walk(x, inverse=False)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """The preimages of ``y`` (int64 values in ``[0, n)``)."""
        return self._walk(y, inverse=True)

    def images(self, start: int, stop: int) -> np.ndarray:
        """``self(np.arange(start, stop))``, from :data:`BLOCK`-aligned blocks of images computed
        once and kept (the last two): a reader asks for consecutive ranges, a few at a time."""
        parts = []
        for b in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            block = self._blocks.get(b)
            if block is None:
                block = self(np.arange(b * BLOCK, min((b + 1) * BLOCK, self.n), dtype=np.int64))
                self._blocks[b] = block
                for old in list(self._blocks)[:-2]:  # threads may share this: pop, never del
                    self._blocks.pop(old, None)
            lo = max(start - b * BLOCK, 0)
            parts.append(block[lo : min(stop - b * BLOCK, BLOCK)])
        out: np.ndarray = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out


@dataclass(frozen=True, slots=True, eq=False)
class EpochOrder:
    """Order position -> global sample id for one epoch, evaluated only where asked.

    Order slot ``j`` holds span ``perm(j)`` (spans numbered in shard order); all spans are ``span``
    long except the short last span of some shards. ``short_end[i]`` is the order position where
    the ``i``-th short span (in order) ends and ``deficit[i]`` the samples the short spans before it
    lack, so a position's slot follows from one binary search over the shards' short spans.
    ``first_span`` and ``first_id`` give each non-empty shard's first span id and first global id.
    """

    size: int
    span: int
    perm: KeyedPermutation | None
    first_span: np.ndarray
    first_id: np.ndarray
    short_end: np.ndarray
    deficit: np.ndarray

    def take(self, pos: np.ndarray) -> np.ndarray:
        """The global ids at order positions ``pos`` (int64 array, each in ``[0, size)``)."""
        pos = np.asarray(pos, dtype=np.int64)
        if self.perm is None or pos.size == 0:
            same: np.ndarray = pos
            return same
        lo, hi = int(pos.min()), int(pos.max()) + 1
        if hi - lo <= 2 * pos.size:  # read from a few ranges: evaluate the range once, in order
            ranged = self._ids(self.perm, np.arange(lo, hi, dtype=np.int64), ordered=True)
            picked: np.ndarray = ranged[pos - lo]
            return picked
        return self._ids(self.perm, pos, ordered=False)

    def _ids(self, perm: KeyedPermutation, pos: np.ndarray, ordered: bool) -> np.ndarray:
        """:meth:`take` of non-empty ``pos``; ``ordered``: increasing. The span ids of slots near
        each other come from :meth:`KeyedPermutation.images` (once per slot, blocks kept)."""
        shifted = pos + self.deficit[np.searchsorted(self.short_end, pos, side="right")]
        slot, offset = np.divmod(shifted, self.span)
        first, last = (int(slot[0]), int(slot[-1])) if ordered else (slot.min(), slot.max())
        if last - first < max(4 * slot.size, BLOCK):  # nearby slots: from blocks of images
            span_id, slot = perm.images(int(first), int(last) + 1), slot - first
        else:  # slots far apart: only theirs
            span_id, slot = perm(slot), np.arange(slot.size)
        shard = np.searchsorted(self.first_span, span_id, side="right") - 1
        start = self.first_id[shard] + (span_id - self.first_span[shard]) * self.span
        out: np.ndarray = start[slot] + offset
        return out


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([seed, epoch, ORDER_TAG]).generate_state(ROUNDS, np.uint64)


@functools.lru_cache(maxsize=8)
def _build(counts: tuple[int, ...], span: int, shuffle: bool, seed: int, epoch: int) -> EpochOrder:
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    size = int(c.sum())
    none = np.zeros(0, np.int64)
    if not shuffle:
        return EpochOrder(size, span, None, none, none, none, none)
    nonempty = c > 0
    first_id = (np.cumsum(c) - c)[nonempty]
    c = c[nonempty]
    spans = -(-c // span)
    first_span = np.cumsum(spans) - spans
    perm = KeyedPermutation(int(spans.sum()), _round_keys(seed, epoch))
    short = np.flatnonzero(c % span)
    slots = perm.inverse(first_span[short] + spans[short] - 1)
    by_slot = np.argsort(slots)
    slots, lengths = slots[by_slot], (c % span)[short][by_slot]
    deficit = np.zeros(slots.size + 1, np.int64)
    np.cumsum(span - lengths, out=deficit[1:])
    short_end = slots * span - deficit[:-1] + lengths
    return EpochOrder(size, span, perm, first_span, first_id, short_end, deficit)


def order_of(cfg: PlanConfig, epoch: int) -> EpochOrder:
    """The epoch order of ``cfg`` (cached: the last few configs and epochs)."""
    return _build(cfg.counts, cfg.span, cfg.shuffle, cfg.seed, as_int(epoch, "epoch", 0))


def epoch_order(cfg: PlanConfig, epoch: int) -> np.ndarray:
    """The epoch's order of all global sample ids (int64), before any rank or worker split.

    This materialises the whole order (for tests and small splits); the plan itself never does.
    """
    order = order_of(cfg, epoch)
    return order.take(np.arange(order.size, dtype=np.int64))


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
