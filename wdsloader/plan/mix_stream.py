"""The mix's sources as streams and the epoch's mixed order: a keyed permutation of
``[0, n)`` evaluated where asked, each source's endless stream of sample ids
(:func:`source_ids`), one epoch's input (:class:`MixEpoch`) and the ``batching="mixed"`` order
of its samples (:func:`mixed_layout`). Pure functions; :mod:`wdsloader.plan.mix` deals them to
ranks and workers."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.order import ROUNDS, KeyedPermutation

__all__ = ["MixEpoch", "epoch_ids", "epoch_offsets", "mixed_layout", "source_ids"]


# ------------------------------------------------------------------------ keyed permutation


@functools.lru_cache(maxsize=256)
def _key(*parts: int) -> np.ndarray:
    """Feistel round keys (uint64) from integer parts, the same on every platform (cached,
    read-only)."""
    keys: np.ndarray = np.random.SeedSequence([*parts]).generate_state(ROUNDS, np.uint64)
    keys.flags.writeable = False
    return keys


def _permute(n: int, keys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x`` (int64 values in ``[0, n)``) through the keyed bijection of ``[0, n)``."""
    x = np.asarray(x, dtype=np.int64)
    if n <= 1:
        same: np.ndarray = x.copy()
        return same
    perm = KeyedPermutation(n, keys)
    lo, hi = int(x.min(initial=0)), int(x.max(initial=-1)) + 1
    if 0 < hi - lo <= x.size // 2:  # values from a narrow range, many repeated: each once
        out: np.ndarray = perm(np.arange(lo, hi, dtype=np.int64))[x - lo]
        return out
    return perm(x)


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
    out[inside] = _permute(whole, keys, j // block) * block + j % block
    return out


# ----------------------------------------------------------------------------------- epochs

_SOURCE_TAG = 0x5043_5EED
_BLOCK_TAG = 0xB10C_5EED


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


def epoch_ids(me: MixEpoch, src: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Sample ids (in their sources) of the ``k``-th epoch samples of sources ``src``: the
    streams' positions ``offsets[src] + k`` (``k`` in ``[0, quota)``)."""
    ids = np.empty(src.size, dtype=np.int64)
    for s in np.unique(src).tolist():
        sel = src == s
        keys = _key(me.seed, s, _SOURCE_TAG)
        # the stream cycles every ``size`` positions: its position mod size, summed in uint64
        # (an offset or a quota near the int64 limit would overflow the sum)
        size = me.sizes[s]
        start = np.uint64(me.offsets[s] % size)
        stream = ((k[sel] % size).astype(np.uint64) + start) % np.uint64(size)
        ids[sel] = source_ids(size, me.block, keys, stream.astype(np.int64))
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
    blocks = _permute(int(whole.sum()), _key(me.seed, me.epoch, _BLOCK_TAG), rest // b)
    s = np.searchsorted(whole_start, blocks, side="right") - 1
    src[~head], k[~head] = s, (blocks - whole_start[s]) * b + rest % b
    return src, epoch_ids(me, src, k)
