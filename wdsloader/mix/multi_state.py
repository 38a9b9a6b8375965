"""The state of a :class:`~wdsloader.mix.MultiDataLoader` as one frozen record
(:class:`MultiState`: epoch, schedule position, each loader's progress) and its JSON-able dict
form; a damaged or foreign state is a :class:`~wdsloader.errors.StateMismatchError` naming the
key, at ``load_state_dict``, instead of a wrong resume or a failure at the first step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.errors import StateMismatchError
from wdsloader.mix.schedule import MultiDataLoaderConfig, epoch_schedule

__all__ = ["LoaderProgress", "MultiState"]

STATE_FORMAT = "wdsloader.mix.multi"
STATE_VERSION = 1
INT64_MAX = 2**63 - 1
MAX_EPOCH = 2**62  # the next epoch, and the seeds derived from it, stay within int64


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _fail(message: str) -> StateMismatchError:
    return StateMismatchError(f"malformed MultiDataLoader state: {message}")


def _get(data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    """``data[key]``, checked to be a ``kind`` (an int: not a bool)."""
    if key not in data:
        raise _fail(f"key {where}{key!r} is missing")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(f"{where}{key!r} should be {kind.__name__}, got {_type_name(value)}")
    return value


def _count(value: int, name: str, high: int = INT64_MAX) -> int:
    if not 0 <= value <= high:
        shown = repr(value) if value.bit_length() <= 128 else f"{value.bit_length()} bits"
        raise _fail(f"{name} = {shown} is out of bounds (from 0 to {high})")
    return value


@dataclass(frozen=True, slots=True)
class LoaderProgress:
    """One loader's progress in the epoch: batches of its current pass, passes completed
    (``cycles``), whether it ran out (``cycle_short_loaders=False``) and its own state (None
    when it has none or was not used yet)."""

    name: str
    batches: int
    cycles: int
    exhausted: bool
    state: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batches": self.batches,
            "cycles": self.cycles,
            "exhausted": self.exhausted,
            "state": self.state,
        }

    @classmethod
    def from_dict(cls, row: object, where: str) -> LoaderProgress:
        if not isinstance(row, Mapping):
            raise _fail(f"{where.rstrip('.')!r} should be dict, got {_type_name(row)}")
        if "state" not in row:
            raise _fail(f"key {where}'state' is missing")
        return cls(
            name=_get(row, "name", str, where),
            batches=_count(_get(row, "batches", int, where), f"{where}'batches'"),
            cycles=_count(_get(row, "cycles", int, where), f"{where}'cycles'"),
            exhausted=_get(row, "exhausted", bool, where),
            state=row["state"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiState:
    """Where a MultiDataLoader stands: ``epoch``, ``position`` (schedule slots consumed) and
    each loader's :class:`LoaderProgress`, with what the schedule was computed from (the
    config's :meth:`~wdsloader.mix.MultiDataLoaderConfig.to_dict` and the loaders' lengths)."""

    config: Mapping[str, Any]
    lengths: tuple[int | None, ...]
    epoch: int
    position: int
    loaders: tuple[LoaderProgress, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict (torchdata's ``state_dict`` protocol)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "config": dict(self.config),
            "lengths": list(self.lengths),
            "epoch": self.epoch,
            "position": self.position,
            "loaders": [row.to_dict() for row in self.loaders],
        }

    @classmethod
    def from_dict(cls, state: object) -> MultiState:
        """The state a :meth:`to_dict` result describes; :class:`StateMismatchError` names a
        missing, mistyped or out-of-bounds key."""
        fmt = state.get("format") if isinstance(state, Mapping) else _type_name(state)
        if fmt != STATE_FORMAT:
            raise StateMismatchError(
                f"not a MultiDataLoader state (format {fmt!r}, expected {STATE_FORMAT!r})"
            )
        assert isinstance(state, Mapping)
        if state.get("version") != STATE_VERSION:
            raise StateMismatchError(
                f"MultiDataLoader state version {state.get('version')!r} is not {STATE_VERSION}"
            )
        config = _get(state, "config", dict)
        lengths = _get(state, "lengths", list)
        for i, n in enumerate(lengths):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
                raise _fail(f"'lengths[{i}]' should be int or None, got {_type_name(n)}")
            if n is not None:
                _count(n, f"'lengths[{i}]'")
        rows = _get(state, "loaders", list)
        if len(rows) != len(lengths):
            raise _fail(f"'loaders' has {len(rows)} entries and 'lengths' {len(lengths)}")
        return cls(
            config=dict(config),
            lengths=tuple(lengths),
            epoch=_count(_get(state, "epoch", int), "'epoch'", MAX_EPOCH),
            position=_count(_get(state, "position", int), "'position'"),
            loaders=tuple(
                LoaderProgress.from_dict(row, f"loaders[{i}].") for i, row in enumerate(rows)
            ),
        )

    def check(
        self, config: MultiDataLoaderConfig, names: Sequence[str], lengths: Sequence[int | None]
    ) -> None:
        """Raise :class:`StateMismatchError` unless this state was taken with ``config``, loaders
        of these ``names`` and ``lengths`` (the schedule would differ), and stands at a point
        of that schedule: ``position`` within the epoch's steps, no loader past the steps the
        schedule gave it."""
        saved, ours = self.config, config.to_dict()
        diff = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        if diff:
            parts = ", ".join(f"{k}: saved {saved.get(k)!r}, now {ours.get(k)!r}" for k in diff)
            raise StateMismatchError(f"cannot resume: the MultiDataLoader config differs ({parts})")
        saved_names = [row.name for row in self.loaders]
        if saved_names != list(names):
            raise StateMismatchError(
                f"cannot resume: the state has loaders {saved_names}, this MultiDataLoader "
                f"{list(names)}"
            )
        if list(self.lengths) != list(lengths):
            raise StateMismatchError(
                f"cannot resume: the loaders' lengths were {list(self.lengths)} and are now "
                f"{list(lengths)}; the schedule would differ"
            )
        sched = epoch_schedule(config, lengths, self.epoch)
        if self.position > sched.size:
            raise _fail(
                f"'position' = {self.position} is past the {sched.size} steps of epoch "
                f"{self.epoch}'s schedule"
            )
        drawn = np.bincount(sched[: self.position], minlength=len(names))
        for i, row in enumerate(self.loaders):
            for key in ("batches", "cycles"):
                if getattr(row, key) > drawn[i]:
                    raise _fail(
                        f"'loaders[{i}].{key}' = {getattr(row, key)} but the schedule gave "
                        f"loader {row.name!r} {drawn[i]} of the {self.position} steps before "
                        "'position'"
                    )
            if row.exhausted and config.cycle_short_loaders:
                raise _fail(
                    f"'loaders[{i}].exhausted' is true but cycle_short_loaders is on (a loader "
                    "that runs out starts a new pass)"
                )
