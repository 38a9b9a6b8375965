"""Schedules: the probability of each curriculum variant as a function of the epoch.

Built-in kinds (each serialisable to a JSON dict with a ``kind``): :func:`fixed`, :func:`linear`,
:func:`cosine`, :func:`steps`, :func:`zero_decay` (the reference default); :func:`from_callable`
wraps any ``epoch -> probabilities`` function (not serialisable to JSON, and picklable for
``spawn``/``forkserver`` workers only when the function is: a module-level function, not a
lambda). Invalid probabilities are a ValueError saying what is wrong.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

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

log = logging.getLogger(__name__)

ProbLike = Mapping[str, float] | Sequence[float]
"""Probabilities by variant name (missing names count 0) or in the variants' declared order."""

SUM_TOLERANCE = 1e-6
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")

# Stored form of a ProbLike: ("map", ((name, p), ...)) or ("seq", (p, ...)).
_Probs = tuple[str, tuple[Any, ...]]


# -- probability helpers ----------------------------------------------------------------------
def _check_value(value: Any, what: str, where: str = "") -> float:
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


def _freeze(probs: ProbLike, what: str, *, must_sum_to_one: bool = True) -> _Probs:
    """Check a ProbLike as far as possible without the variant names; return its stored form."""
    if isinstance(probs, Mapping):
        items = []
        for name, value in probs.items():
            if not isinstance(name, str):
                raise ValueError(f"{what}: variant name {name!r} is not a string")
            items.append((name, _check_value(value, what, repr(name))))
        frozen: _Probs = ("map", tuple(items))
        values = [v for _, v in items]
    elif isinstance(probs, (str, bytes)) or not isinstance(probs, Sequence | np.ndarray):
        raise ValueError(
            f"{what}: expected a mapping name -> probability or a sequence of probabilities, "
            f"got {type(probs).__name__}"
        )
    else:
        values = [_check_value(v, what, f"position {i}") for i, v in enumerate(probs)]
        frozen = ("seq", tuple(values))
    if must_sum_to_one:
        total = math.fsum(values)
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise ValueError(f"{what}: probabilities sum to {total:.9g}, not 1")
    return frozen


def _thaw(frozen: _Probs) -> dict[str, float] | list[float]:
    kind, items = frozen
    return dict(items) if kind == "map" else list(items)


def _resolve(frozen: _Probs, names: tuple[str, ...], what: str) -> np.ndarray:
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
    return as_int(epoch, "epoch", 0)


def _normalise(p: np.ndarray) -> np.ndarray:
    p = np.maximum(p, 0.0)
    return p / p.sum()


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


@dataclass(frozen=True)
class FixedSchedule(Schedule):
    """The same probabilities at every epoch."""

    probs: _Probs

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        check_epoch(epoch)
        return _normalise(_resolve(self.probs, tuple(names), "fixed schedule"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", "probs": _thaw(self.probs)}


@dataclass(frozen=True)
class _Interpolated(Schedule):
    _kind: ClassVar[str] = ""
    start: _Probs
    end: _Probs
    epochs: int

    def _weight(self, progress: float) -> float:  # weight of `end`
        raise NotImplementedError

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        names = tuple(names)
        start = _resolve(self.start, names, f"{self._kind} schedule start")
        end = _resolve(self.end, names, f"{self._kind} schedule end")
        w = self._weight(min(e / self.epochs, 1.0))
        p = start + (end - start) * w
        return _normalise(p)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self._kind,
            "start": _thaw(self.start),
            "end": _thaw(self.end),
            "epochs": self.epochs,
        }

    def key_epochs(self) -> tuple[int, ...]:
        return (0, self.epochs)


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

    table: tuple[tuple[int, _Probs], ...]

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        start, probs = self.table[0]
        for row_start, row_probs in self.table:
            if row_start > e:
                break
            start, probs = row_start, row_probs
        return _normalise(_resolve(probs, tuple(names), f"steps schedule row {start}"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "steps", "table": [[e, _thaw(p)] for e, p in self.table]}

    def key_epochs(self) -> tuple[int, ...]:
        return tuple(e for e, _ in self.table)


@dataclass(frozen=True)
class ZeroDecaySchedule(Schedule):
    """P(zero) falls linearly from ``start`` to ``end`` over ``epochs`` epochs, then stays; the
    other variants share the rest in proportion to ``base`` (equal shares when ``base`` is None)."""

    base: _Probs | None
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
            weights = _resolve(self.base, names, "zero_decay base")
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
        base = None if self.base is None else _thaw(self.base)
        return {"kind": "zero_decay", **asdict(self), "base": base}

    def key_epochs(self) -> tuple[int, ...]:
        return (0, self.epochs)


@dataclass(frozen=True)
class CallableSchedule(Schedule):
    """Probabilities from a user function of the epoch, checked at every call."""

    fn: Callable[[int], ProbLike]

    def probabilities(self, epoch: int, names: tuple[str, ...]) -> np.ndarray:
        e = check_epoch(epoch)
        what = f"schedule function at epoch {e}"
        frozen = _freeze(self.fn(e), what)
        return _normalise(_resolve(frozen, tuple(names), what))

    def to_dict(self) -> dict[str, Any]:
        raise ValueError(
            f"a schedule from a function ({getattr(self.fn, '__qualname__', self.fn)!r}) "
            "cannot be serialised; use fixed/linear/cosine/steps/zero_decay"
        )


def fixed(probs: ProbLike) -> Schedule:
    """The same probabilities at every epoch."""
    return FixedSchedule(_freeze(probs, "fixed schedule"))


def linear(start: ProbLike, end: ProbLike, epochs: int) -> Schedule:
    """From ``start`` at epoch 0 to ``end`` at ``epochs``, linearly, then ``end``."""
    n = as_int(epochs, "linear schedule: epochs", 1)
    return LinearSchedule(
        _freeze(start, "linear schedule start"), _freeze(end, "linear schedule end"), n
    )


def cosine(start: ProbLike, end: ProbLike, epochs: int) -> Schedule:
    """From ``start`` at epoch 0 to ``end`` at ``epochs`` along a half cosine, then ``end``."""
    n = as_int(epochs, "cosine schedule: epochs", 1)
    return CosineSchedule(
        _freeze(start, "cosine schedule start"), _freeze(end, "cosine schedule end"), n
    )


def steps(table: Mapping[int, ProbLike] | Sequence[tuple[int, ProbLike]]) -> Schedule:
    """Piecewise constant: each row ``(start_epoch, probs)`` holds until the next row's start.

    The first row must start at epoch 0; start epochs must be distinct.
    """
    rows = list(table.items()) if isinstance(table, Mapping) else list(table)
    if not rows:
        raise ValueError("steps schedule: the table is empty")
    parsed: list[tuple[int, _Probs]] = []
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
        parsed.append((e, _freeze(probs, f"steps schedule row {e}")))
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
    s = _check_value(start, "zero_decay schedule start")
    f = _check_value(end, "zero_decay schedule end")
    for label, v in (("start", s), ("end", f)):
        if v > 1.0:
            raise ValueError(f"zero_decay schedule: {label} probability {v} is above 1")
    frozen = None if base is None else _freeze(base, "zero_decay base", must_sum_to_one=False)
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
