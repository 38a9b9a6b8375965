"""``MultiDataLoader``: several loaders on one schedule, with exact resume.

Each step draws one batch from the loader the epoch's schedule names (see
:func:`~wdsloader.mix.schedule.epoch_schedule`). The schedule depends only on the config, the
loaders' lengths and the epoch, so every rank with the same lengths steps the same number of times.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.mix.multi_state import LoaderProgress, MultiState
from wdsloader.mix.schedule import MultiDataLoaderConfig, epoch_schedule

__all__ = ["MixStep", "MultiDataLoader"]

log = logging.getLogger(__name__)


class MixStep(NamedTuple):
    """One step: the loader's index, its name and its batch."""

    idx: int
    name: str
    batch: Any


@dataclass
class _Cursor:
    """Where an epoch stands: schedule slots consumed, and per loader the batches of its current
    pass, the passes it completed (cycles) and whether it ran out (``cycle_short_loaders=False``)."""

    position: int
    batches: list[int]
    cycles: list[int]
    exhausted: list[bool]
    iterators: list[Iterator[Any] | None] = field(default_factory=list)
    resume: list[Any] = field(default_factory=list)  # saved loader states not yet loaded

    @staticmethod
    def start(n: int) -> _Cursor:
        return _Cursor(0, [0] * n, [0] * n, [False] * n, [None] * n, [None] * n)


def _stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # no __len__, or an IterableDataset without one: infinite
        return None


def _set_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch`` on the loader, else on its sampler, else on its batch sampler's sampler."""
    for target in (
        loader,
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        if callable(getattr(target, "set_epoch", None)):
            target.set_epoch(epoch)  # type: ignore[union-attr]
            return


class MultiDataLoader:
    """Iterate several loaders on the schedule of a :class:`MultiDataLoaderConfig`.

    Iterating yields a :class:`MixStep` ``(idx, name, batch)`` per step, ``len()`` steps per
    epoch; iterating to the end moves to the next epoch. At the start of an epoch every loader is
    set to it (``loader.set_epoch``, else its sampler's or batch sampler's ``set_epoch``) and
    iterated afresh. A loader that runs out within the epoch starts a new pass with
    ``cycle_short_loaders`` (a loader empty even then is a RuntimeError); without it, its
    remaining steps are left out. With ``cycle_short_loaders``, a loader whose ``len()`` is 0
    and that the schedule gives steps is a ValueError naming it, at construction and at the
    start of every epoch (before any step, the same on every rank).

    ``state_dict()`` holds the epoch, the schedule position, each loader's batches and passes in
    the epoch, and each loader's own ``state_dict()`` when it has one (``create_loader``'s
    loaders, torchdata's ``StatefulDataLoader``): ``load_state_dict()`` then resumes exactly. A
    loader without state (a plain DataLoader) is resumed by skipping the batches it had yielded
    in its current pass, with a logged warning: exact only when its order is a function of its
    epoch (a seeded sampler).
    """

    def __init__(
        self,
        loaders: Sequence[Iterable[Any]],
        config: MultiDataLoaderConfig | None = None,
        *,
        epoch: int = 0,
    ) -> None:
        if isinstance(loaders, (str, bytes)) or not isinstance(loaders, Sequence) or not loaders:
            raise ValueError("MultiDataLoader needs a non-empty list of loaders")
        self.loaders = list(loaders)
        self.config = config if config is not None else MultiDataLoaderConfig()
        if not isinstance(self.config, MultiDataLoaderConfig):
            raise TypeError(
                f"config must be a MultiDataLoaderConfig, got {type(self.config).__name__}"
            )
        self.names: tuple[str, ...] = self.config.check_loaders(len(self.loaders))
        self.epoch = as_int(epoch, "epoch", 0)
        self._pending: MultiState | None = None  # a loaded state not yet started
        self._cursor: _Cursor | None = None  # the epoch being iterated
        self._check_empty(self.epoch)

    # -- schedule ----------------------------------------------------------------------------
    def lengths(self) -> list[int | None]:
        """Each loader's ``len()`` (None for one without a length)."""
        return [_length(loader) for loader in self.loaders]

    def schedule(self, epoch: int | None = None) -> np.ndarray:
        """The loader index of every step of ``epoch`` (default: the current one)."""
        e = self.epoch if epoch is None else epoch
        return epoch_schedule(self.config, self.lengths(), e)

    def _check_empty(self, epoch: int, sched: np.ndarray | None = None) -> None:
        """ValueError naming the loaders of ``len()`` 0 that ``epoch``'s schedule draws from
        (they would run out mid-epoch on every rank; ``cycle_short_loaders=False`` leaves
        their steps out instead)."""
        lengths = self.lengths()
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if not empty or not self.config.cycle_short_loaders:
            return
        if sched is None:
            sched = epoch_schedule(self.config, lengths, epoch)
        steps = np.bincount(sched, minlength=len(lengths))
        used = [f"{self.names[i]!r} ({int(steps[i])} steps)" for i in empty if steps[i]]
        if used:
            raise ValueError(
                f"MultiDataLoader: loaders with len() 0 get steps of epoch {epoch} "
                f"({sched.size} steps, {self.config.strategy.label}): {', '.join(used)}; "
                "leave them out (with WEIGHTED: weight 0), or pass cycle_short_loaders=False "
                "to leave out their steps"
            )

    def __len__(self) -> int:
        return int(self.schedule().size)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration play ``epoch``; a loaded state of another epoch is dropped."""
        epoch = as_int(epoch, "epoch", 0)
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None
        self.epoch = epoch

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[MixStep]:
        epoch = self.epoch
        sched = self.schedule(epoch)
        self._check_empty(epoch, sched)
        n = len(self.loaders)
        cur, pending, self._pending = _Cursor.start(n), self._pending, None
        # a loader's own saved state, loaded when the epoch first uses it (an unused one would
        # hold a stale position into the next epoch); loaders without one skip batches instead
        resume: list[Any] = [None] * n
        if pending is not None:
            cur.position = pending.position
            for i, row in enumerate(pending.loaders):
                cur.batches[i], cur.cycles[i] = row.batches, row.cycles
                cur.exhausted[i] = row.exhausted
                if row.state is not None and _stateful(self.loaders[i]):
                    resume[i] = row.state
        for i, loader in enumerate(self.loaders):
            if resume[i] is None:
                _set_epoch(loader, epoch)
        skip = [0 if resume[i] is not None else cur.batches[i] for i in range(n)]
        cur.resume = resume
        self._cursor = cur
        while cur.position < sched.size:
            i = int(sched[cur.position])
            found, batch = self._next(i, cur, skip)
            cur.position += 1
            if found:
                yield MixStep(i, self.names[i], batch)
                del batch
        self._cursor = None
        self.epoch = epoch + 1

    def _next(self, i: int, cur: _Cursor, skip: list[int]) -> tuple[bool, Any]:
        """``(True, batch)`` from loader ``i``, or ``(False, None)`` for a slot left out."""
        if cur.exhausted[i]:
            return False, None
        it = cur.iterators[i]
        if it is None:
            if cur.resume[i] is not None:
                self.loaders[i].load_state_dict(cur.resume[i])  # type: ignore[attr-defined]
                cur.resume[i] = None
            it = cur.iterators[i] = self._start(i, skip[i])
        try:
            batch = next(it)
        except StopIteration:
            if not self.config.cycle_short_loaders:
                log.warning(
                    "MultiDataLoader: loader %r ran out after %d batches, before the %d of "
                    "its len(); its remaining steps this epoch are left out",
                    self.names[i], cur.batches[i], _length(self.loaders[i]),
                )  # fmt: skip
                cur.exhausted[i] = True
                return False, None
            cur.cycles[i] += 1
            cur.batches[i] = 0
            it = cur.iterators[i] = iter(self.loaders[i])
            try:
                batch = next(it)
            except StopIteration:
                raise RuntimeError(
                    f"Loader {self.names[i]!r} exhausted even after cycling (it yields no batch)"
                ) from None
        cur.batches[i] += 1
        return True, batch

    def _start(self, i: int, skip: int) -> Iterator[Any]:
        it = iter(self.loaders[i])
        if skip:
            log.warning(
                "MultiDataLoader: loader %r (%s) has no state_dict; resuming it by reading and "
                "dropping the %d batches it had yielded in this pass (exact only if its order "
                "depends on nothing but its epoch)",
                self.names[i], type(self.loaders[i]).__name__, skip,
            )  # fmt: skip
            for n in range(skip):
                if next(it, _END) is _END:
                    raise RuntimeError(
                        f"cannot resume loader {self.names[i]!r}: it yields {n} batches, "
                        f"fewer than the {skip} the state says it had yielded"
                    )
        return it

    # -- state -------------------------------------------------------------------------------
    def state(self) -> MultiState:
        """The position: epoch, schedule position, per-loader batches, passes and own state
        (the latter only for loaders used in the epoch so far: the others start it afresh)."""
        if self._pending is not None:
            return self._pending
        cur = self._cursor or _Cursor.start(len(self.loaders))
        rows = []
        for i, name in enumerate(self.names):
            inner = self._inner_state(i, cur)
            rows.append(
                LoaderProgress(name, cur.batches[i], cur.cycles[i], cur.exhausted[i], inner)
            )
        return MultiState(
            config=self.config.to_dict(), lengths=tuple(self.lengths()), epoch=self.epoch,
            position=cur.position, loaders=tuple(rows),
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """:meth:`state` as a JSON-able dict."""
        return self.state().to_dict()

    def _inner_state(self, i: int, cur: _Cursor) -> Any:
        if cur.resume[i] is not None:  # resumed, not used since: its saved state still holds
            return cur.resume[i]
        loader = self.loaders[i]
        if not (cur.batches[i] or cur.cycles[i]) or not _stateful(loader):
            return None
        return loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Mapping[str, Any] | MultiState) -> None:
        """Continue from ``state``: the next iteration yields the steps that followed it.

        A state taken with another config, other loader names or other loader lengths (the
        schedule would differ) is a :class:`~wdsloader.errors.StateMismatchError` naming what
        differs; so is a damaged one (a key missing, mistyped or out of bounds, a position past
        the epoch's schedule), naming the key.
        """
        loaded = MultiState.from_dict(state.to_dict() if isinstance(state, MultiState) else state)
        loaded.check(self.config, self.names, self.lengths())
        self.epoch = loaded.epoch
        self._pending = loaded


_END = object()
