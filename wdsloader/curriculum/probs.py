"""Probabilities of curriculum variants: checked, stored in a hashable form, and resolved against
the variants' names (ValueErrors say what is wrong)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wdsloader.format.checks import as_int

ProbLike = Mapping[str, float] | Sequence[float]
"""Probabilities by variant name (missing names count 0) or in the variants' declared order."""

SUM_TOLERANCE = 1e-6
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")

# Stored form of a ProbLike: ("map", ((name, p), ...)) or ("seq", (p, ...)).
Probs = tuple[str, tuple[Any, ...]]


def check_value(value: Any, what: str, where: str = "") -> float:
    """``value`` as a probability (a finite float >= 0), or a ValueError naming ``where``."""
    at = f" for {where}" if where else ""
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: probability {value!r}{at} is not a number") from None
    if math.isnan(p):
        raise ValueError(f"{what}: probability{at} is NaN")
    if math.isinf(p):
        raise ValueError(f"{what}: probability{at} is infinite")
    if p < 0:
        raise ValueError(f"{what}: probability {p}{at} is negative")
    return p


def freeze(probs: ProbLike, what: str, *, must_sum_to_one: bool = True) -> Probs:
    """Check a ProbLike as far as possible without the variant names; return its stored form."""
    if isinstance(probs, Mapping):
        items = []
        for name, value in probs.items():
            if not isinstance(name, str):
                raise ValueError(f"{what}: variant name {name!r} is not a string")
            items.append((name, check_value(value, what, repr(name))))
        frozen: Probs = ("map", tuple(items))
        values = [v for _, v in items]
    elif isinstance(probs, (str, bytes)) or not isinstance(probs, Sequence | np.ndarray):
        raise ValueError(
            f"{what}: expected a mapping name -> probability or a sequence of probabilities, "
            f"got {type(probs).__name__}"
        )
    else:
        values = [check_value(v, what, f"position {i}") for i, v in enumerate(probs)]
        frozen = ("seq", tuple(values))
    if must_sum_to_one:
        total = math.fsum(values)
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise ValueError(f"{what}: probabilities sum to {total:.9g}, not 1")
    return frozen


def thaw(frozen: Probs) -> dict[str, float] | list[float]:
    """The stored form back as the dict or list it was given as."""
    kind, items = frozen
    return dict(items) if kind == "map" else list(items)


def resolve(frozen: Probs, names: tuple[str, ...], what: str) -> np.ndarray:
    """The probabilities in the order of ``names`` (float64), checked."""
    kind, items = frozen
    if kind == "map":
        out = np.zeros(len(names), dtype=np.float64)
        position = {n: i for i, n in enumerate(names)}
        for name, value in items:
            if name not in position:
                raise ValueError(
                    f"{what}: unknown variant {name!r}; valid variants: {', '.join(names)}"
                )
            out[position[name]] = value
    else:
        if len(items) != len(names):
            raise ValueError(
                f"{what}: {len(items)} probabilities for {len(names)} variants ({', '.join(names)})"
            )
        out = np.asarray(items, dtype=np.float64)
    return out


def check_epoch(epoch: int) -> int:
    """``epoch`` as an int >= 0, or a ValueError/TypeError naming it."""
    return as_int(epoch, "epoch", 0)


def normalise(p: np.ndarray) -> np.ndarray:
    """``p`` clipped at 0 and scaled to sum to 1."""
    p = np.maximum(p, 0.0)
    return p / p.sum()
