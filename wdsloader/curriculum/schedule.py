"""Schedules: the probability of each curriculum variant as a function of the epoch.

Built-in kinds (each serialisable to a JSON dict with a ``kind``): :func:`fixed`, :func:`linear`,
:func:`cosine`, :func:`steps`, :func:`zero_decay` (the reference default); :func:`from_callable`
wraps any ``epoch -> probabilities`` function (not serialisable to JSON, and picklable for
``spawn``/``forkserver`` workers only when the function is: a module-level function, not a
lambda). Invalid probabilities are a ValueError saying what is wrong.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from wdsloader.curriculum.probs import (
    ProbLike,
    Probs,
    check_epoch,
    check_value,
    freeze,
    normalise,
    resolve,
    thaw,
)
from wdsloader.format.checks import as_int

__all__ = [
    "CallableSchedule",
    "CosineSchedule",
    "FixedSchedule",
    "LinearSchedule",
    "ProbLike",
    "Schedule",
    "StepsSchedule",
    "ZeroDecaySchedule",
    "cosine",
    "fixed",
    "from_callable",
    "linear",
    "schedule_from_dict",
    "steps",
    "zero_decay",
]


# -- schedules --------------------------------------------------------------------------------
class Schedule:
    """Probabilities of a curriculum's variants as a function of the epoch."""

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        """Probabilities of ``names`` at ``epoch``: float64, one per name, summing to 1."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description with a ``"kind"``; :func:`schedule_from_dict` inverts it."""
        raise NotImplementedError

    def key_epochs(self) -> tuple[int, ...]:
        """The epochs where this schedule's inputs take effect; a curriculum checks the schedule
        there at construction, so bad input fails early."""
        return (0,)

    def steady_from(self) -> int | None:
        """The epoch from which the probabilities never change again (None: not known, as for
        a function's); a mix sums the quotas of the epochs before it only."""
        return None


@dataclass(frozen=True)
class FixedSchedule(Schedule):
    """The same probabilities at every epoch."""

    probs: Probs

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        check_epoch(epoch)
        return normalise(resolve(self.probs, tuple(names), "fixed schedule"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", "probs": thaw(self.probs)}

    def steady_from(self) -> int | None:
        return 0


@dataclass(frozen=True)
class _Interpolated(Schedule):
    _kind: ClassVar[str] = ""
    start: Probs
    end: Probs
    epochs: int

    def _weight(self, progress: float) -> float:  # weight of `end`
        raise NotImplementedError

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        names = tuple(names)
        start = resolve(self.start, names, f"{self._kind} schedule start")
        end = resolve(self.end, names, f"{self._kind} schedule end")
        w = self._weight(min(e / self.epochs, 1.0))
        p = start + (end - start) * w
        return normalise(p)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self._kind,
            "start": thaw(self.start),
            "end": thaw(self.end),
            "epochs": self.epochs,
        }

    def key_epochs(self) -> tuple[int, ...]:
        return (0, self.epochs)

    def steady_from(self) -> int | None:
        return self.epochs  # min(epoch / epochs, 1) is 1 from there


@dataclass(frozen=True)
class LinearSchedule(_Interpolated):
    """``start + (end - start) * min(epoch / epochs, 1)``."""

    _kind: ClassVar[str] = "linear"

    def _weight(self, progress: float) -> float:
        return progress


@dataclass(frozen=True)
class CosineSchedule(_Interpolated):
    """``end + (start - end) * (1 + cos(pi * min(epoch / epochs, 1))) / 2``."""

    _kind: ClassVar[str] = "cosine"

    def _weight(self, progress: float) -> float:
        return 1.0 - (1.0 + math.cos(math.pi * progress)) / 2.0


@dataclass(frozen=True)
class StepsSchedule(Schedule):
    """Piecewise constant: the row with the largest start epoch <= epoch."""

    table: tuple[tuple[int, Probs], ...]

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        start, probs = self.table[0]
        for row_start, row_probs in self.table:
            if row_start > e:
                break
            start, probs = row_start, row_probs
        return normalise(resolve(probs, tuple(names), f"steps schedule row {start}"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "steps", "table": [[e, thaw(p)] for e, p in self.table]}

    def key_epochs(self) -> tuple[int, ...]:
        return tuple(e for e, _ in self.table)

    def steady_from(self) -> int | None:
        return max(e for e, _ in self.table)


@dataclass(frozen=True)
class ZeroDecaySchedule(Schedule):
    """P(zero) falls linearly from ``start`` to ``end`` over ``epochs`` epochs, then stays; the
    other variants share the rest in proportion to ``base`` (equal shares when ``base`` is None)."""

    base: Probs | None
    zero: str
    start: float
    end: float
    epochs: int

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        names = tuple(names)
        if self.zero not in names:
            raise ValueError(
                f"zero_decay schedule: no variant named {self.zero!r}; variants: {', '.join(names)}"
            )
        z = names.index(self.zero)
        if self.base is None:
            weights = np.ones(len(names), dtype=np.float64)
        else:
            weights = resolve(self.base, names, "zero_decay base")
        weights[z] = 0.0
        total = weights.sum()
        if not total > 0:
            raise ValueError(
                f"zero_decay schedule: the variants other than {self.zero!r} have base "
                "probabilities that are all 0 (or there are no other variants)"
            )
        p_zero = self.start + (self.end - self.start) * min(e / self.epochs, 1.0)
        p = weights * ((1.0 - p_zero) / total)
        p[z] = p_zero
        return p

    def to_dict(self) -> dict[str, Any]:
        base = None if self.base is None else thaw(self.base)
        return {"kind": "zero_decay", **asdict(self), "base": base}

    def key_epochs(self) -> tuple[int, ...]:
        return (0, self.epochs)

    def steady_from(self) -> int | None:
        return self.epochs  # min(epoch / epochs, 1) is 1 from there


@dataclass(frozen=True)
class CallableSchedule(Schedule):
    """Probabilities from a user function of the epoch, checked at every call."""

    fn: Callable[[int], ProbLike]

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        what = f"schedule function at epoch {e}"
        frozen = freeze(self.fn(e), what)
        return normalise(resolve(frozen, tuple(names), what))

    def to_dict(self) -> dict[str, Any]:
        raise ValueError(
            f"a schedule from a function ({getattr(self.fn, '__qualname__', self.fn)!r}) "
            "cannot be serialised; use fixed/linear/cosine/steps/zero_decay"
        )


def fixed(probs: ProbLike) -> Schedule:
    """The same probabilities at every epoch."""
    return FixedSchedule(freeze(probs, "fixed schedule"))


def linear(start: ProbLike, end: ProbLike, epochs: int) -> Schedule:
    """From ``start`` at epoch 0 to ``end`` at ``epochs``, linearly, then ``end``."""
    n = as_int(epochs, "linear schedule: epochs", 1)
    return LinearSchedule(
        freeze(start, "linear schedule start"), freeze(end, "linear schedule end"), n
    )


def cosine(start: ProbLike, end: ProbLike, epochs: int) -> Schedule:
    """From ``start`` at epoch 0 to ``end`` at ``epochs`` along a half cosine, then ``end``."""
    n = as_int(epochs, "cosine schedule: epochs", 1)
    return CosineSchedule(
        freeze(start, "cosine schedule start"), freeze(end, "cosine schedule end"), n
    )


def steps(table: Mapping[int, ProbLike] | Sequence[tuple[int, ProbLike]]) -> Schedule:
    """Piecewise constant: each row ``(start_epoch, probs)`` holds until the next row's start.

    The first row must start at epoch 0; start epochs must be distinct.
    """
    rows = list(table.items()) if isinstance(table, Mapping) else list(table)
    if not rows:
        raise ValueError("steps schedule: the table is empty")
    parsed: list[tuple[int, Probs]] = []
    seen: set[int] = set()
    for row in rows:
        try:
            start, probs = row
            e = operator.index(start)
        except (TypeError, ValueError):
            raise ValueError(
                f"steps schedule: row {row!r} is not (start_epoch: int, probabilities)"
            ) from None
        if e in seen:
            raise ValueError(f"steps schedule: duplicate start epoch {e}")
        seen.add(e)
        parsed.append((e, freeze(probs, f"steps schedule row {e}")))
    parsed.sort(key=lambda r: r[0])
    if parsed[0][0] != 0:
        raise ValueError(f"steps schedule: the first row must start at epoch 0, not {parsed[0][0]}")
    return StepsSchedule(tuple(parsed))


def zero_decay(
    base: ProbLike | None = None,
    *,
    zero: str = "zero",
    start: float = 0.5,
    end: float = 0.1,
    epochs: int = 100,
) -> Schedule:
    """The reference curriculum: P(``zero``) goes linearly from ``start`` (epoch 0) to ``end``
    (epoch ``epochs`` and after); the other variants share ``1 - P(zero)`` in proportion to their
    ``base`` probabilities (equal when ``base`` is None; ``base``'s own ``zero`` entry is ignored).
    """
    n = as_int(epochs, "zero_decay schedule: epochs", 1)
    if not isinstance(zero, str) or not zero:
        raise ValueError(f"zero_decay schedule: zero must be a variant name, got {zero!r}")
    s = check_value(start, "zero_decay schedule start")
    f = check_value(end, "zero_decay schedule end")
    for label, v in (("start", s), ("end", f)):
        if v > 1.0:
            raise ValueError(f"zero_decay schedule: {label} probability {v} is above 1")
    frozen = None if base is None else freeze(base, "zero_decay base", must_sum_to_one=False)
    return ZeroDecaySchedule(frozen, zero, s, f, n)


def from_callable(fn: Callable[[int], ProbLike]) -> Schedule:
    """Probabilities from ``fn(epoch)``, checked at every call (errors name the epoch).

    Loaders whose workers start by ``spawn`` or ``forkserver`` pickle ``fn``: give a module-level
    function (a lambda or closure is refused by ``create_loader``, naming the curriculum).
    """
    if not callable(fn):
        raise ValueError(f"from_callable: {fn!r} is not callable")
    return CallableSchedule(fn)


def _require(data: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in data:
        raise ValueError(f"{kind} schedule dict: missing {key!r} (has {sorted(data)})")
    return data[key]


def schedule_from_dict(data: Mapping[str, Any]) -> Schedule:
    """The schedule a :meth:`Schedule.to_dict` result describes."""
    if not isinstance(data, Mapping):
        raise ValueError(f"schedule dict: expected a mapping, got {type(data).__name__}")
    kind = data.get("kind")
    if kind == "fixed":
        return fixed(_require(data, "probs", kind))
    if kind in ("linear", "cosine"):
        make = linear if kind == "linear" else cosine
        return make(
            _require(data, "start", kind),
            _require(data, "end", kind),
            _require(data, "epochs", kind),
        )
    if kind == "steps":
        table = _require(data, "table", kind)
        if isinstance(table, Mapping):  # JSON object keys are strings
            try:
                table = {int(k): v for k, v in table.items()}
            except ValueError:
                raise ValueError(f"steps schedule dict: table keys {list(table)} not int") from None
        return steps(table)
    if kind == "zero_decay":
        return zero_decay(
            data.get("base"),
            zero=data.get("zero", "zero"),
            start=data.get("start", 0.5),
            end=data.get("end", 0.1),
            epochs=data.get("epochs", 100),
        )
    raise ValueError(
        f"schedule dict: unknown kind {kind!r}; kinds: fixed, linear, cosine, steps, zero_decay"
    )
