"""Exact integer quotas from weights (largest remainder, in exact rational arithmetic, so every
platform rounds the same way), an even interleave of quotas, and a mix's per-epoch quotas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from wdsloader.format.checks import MAX_INT, as_int

__all__ = ["even_interleave", "largest_remainder", "mix_quotas"]


def _weights(weights: Sequence[float], what: str) -> list[Fraction]:
    out = []
    for i, w in enumerate(weights):
        try:
            f = float(w)
        except (TypeError, ValueError):
            raise ValueError(f"{what}[{i}] = {w!r} is not a number") from None
        if not math.isfinite(f) or f < 0:
            raise ValueError(f"{what}[{i}] = {w!r} must be a finite number >= 0")
        out.append(Fraction(repr(f)))  # the decimal the user wrote: 0.3 is 3/10
    if not out or sum(out) <= 0:
        raise ValueError(f"{what} must sum to more than 0, got {list(weights)!r}")
    return out


def largest_remainder(weights: Sequence[float], total: int, *, what: str = "weights") -> np.ndarray:
    """``total`` split in proportion to ``weights`` (int64, summing to ``total``).

    Each share is the floor of its exact quota; the units left over go to the largest
    remainders, ties to the lower index. A float weight counts as the shortest decimal that
    prints as it (``0.3`` is 3/10, not the binary double just below). ``what`` names the
    weights in errors.
    """
    total = as_int(total, "total", 0)
    fw = _weights(weights, what)
    s = sum(fw)
    exact = [w * total / s for w in fw]
    quotas = [math.floor(q) for q in exact]
    left = total - sum(quotas)
    order = sorted(range(len(fw)), key=lambda i: (-(exact[i] - quotas[i]), i))
    for i in order[:left]:
        quotas[i] += 1
    return np.asarray(quotas, dtype=np.int64)


def even_interleave(quotas: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices ``i`` repeated ``quotas[i]`` times, spread evenly: the ``k``-th occurrence of
    ``i`` sits at ideal time ``(k + 1/2) / quotas[i]``; equal times go to the lower index.

    Every prefix of length ``t`` holds each index about ``t * quotas[i] / sum(quotas)`` times.
    """
    q = np.asarray([as_int(v, f"quotas[{i}]", 0) for i, v in enumerate(quotas)], dtype=np.int64)
    owner = np.repeat(np.arange(q.size, dtype=np.int64), q)
    first = np.cumsum(q) - q
    k = np.arange(owner.size, dtype=np.int64) - first[owner]
    # correctly rounded division: equal rationals give equal floats on every platform
    time = (2 * k + 1) / (2.0 * q[owner]) if owner.size else np.zeros(0)
    out: np.ndarray = owner[np.lexsort((owner, time))]
    return out


def mix_quotas(
    sizes: Sequence[int],
    weights: Sequence[float | None],
    fixed: Sequence[int | None],
    epoch_samples: int | None = None,
    *,
    names: Sequence[str] | None = None,
    split: str | None = None,
) -> np.ndarray:
    """Samples each source contributes to one epoch (int64).

    Source ``i`` takes ``fixed[i]`` samples when that is not None, else a share of what the fixed
    sources leave of ``epoch_samples`` by largest remainder over the ``weights`` of the weighted
    sources. ``epoch_samples=None`` is the fixed quotas plus the sizes of the weighted sources.
    Errors name the sources by ``names`` (default: their indices) and the ``split``, if given.
    """
    n = len(sizes)
    if not (len(weights) == len(fixed) == n) or n == 0:
        raise ValueError(
            f"sizes, weights and fixed must have one entry per source, got {n}, "
            f"{len(weights)} and {len(fixed)}"
        )
    label = list(range(n)) if names is None else list(names)
    size = [as_int(s, f"sizes[{i}]", 0) for i, s in enumerate(sizes)]
    quotas = np.zeros(n, dtype=np.int64)
    weighted = [i for i in range(n) if fixed[i] is None]
    given = {i: as_int(f, f"fixed[{i}]", 0) for i, f in enumerate(fixed) if f is not None}
    # the epoch's samples by source (a weighted one's: its size, unless epoch_samples is given)
    parts = given if epoch_samples is not None else {**given, **{i: size[i] for i in weighted}}
    _check_int64(parts, label, split)
    for i in range(n):
        if i in given:
            quotas[i] = given[i]
        elif weights[i] is None:
            raise ValueError(
                f"source {label[i]!r} has neither a weight nor a fixed number of samples"
            )
    left = (
        sum(size[i] for i in weighted)
        if epoch_samples is None
        else as_int(epoch_samples, "epoch_samples", 0, MAX_INT) - int(quotas.sum())
    )
    if weighted:
        if left < 0:
            raise ValueError(
                f"epoch_samples={epoch_samples} is less than the {int(quotas.sum())} samples "
                "the sources with samples=/repeat= take"
            )
        share = [weights[i] for i in weighted]
        quotas[weighted] = largest_remainder(share, left, what="weights")  # type: ignore[arg-type]
    elif epoch_samples is not None and left != 0:
        raise ValueError(
            f"epoch_samples={epoch_samples} differs from the {int(quotas.sum())} samples the "
            "sources take (every source has samples= or repeat=; leave epoch_samples out)"
        )
    empty = [i for i in range(n) if size[i] == 0 and quotas[i] > 0]
    if empty:
        where = "" if split is None else f" in split {split!r}"
        raise ValueError(
            f"sources {[label[i] for i in empty]} have no samples{where} but a quota of "
            f"{quotas[empty].tolist()} samples per epoch: leave them out of this split's mix"
        )
    return quotas


def _check_int64(parts: dict[int, int], label: Sequence[object], split: str | None) -> None:
    """ValueError naming the sources when the epoch's samples (``parts``: by source) pass what
    an int64 holds."""
    total = sum(parts.values())
    if total <= MAX_INT:
        return
    where = "" if split is None else f" of split {split!r}"
    shown = {label[i]: q for i, q in sorted(parts.items())}
    raise ValueError(
        f"the epoch{where} would hold {total} samples, more than an int64 holds ({MAX_INT}): "
        f"samples per source {shown}"
    )
