"""Which loader each step of an epoch draws from: the config, and the schedule as a pure function
of the config, the loaders' lengths and the epoch (the strategies, one module each, are in
:mod:`wdsloader.mix.sampling`).

Every rank computes the same schedule from the same inputs, so ranks need no communication to
agree on it (with loaders whose length is the same on every rank, e.g. ``create_loader``'s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.mix.sampling.base import (
    STRATEGY_OPTIONS,
    EpochLengthPolicy,
    Lengths,
    LoaderSampling,
    SamplingStrategy,
)
from wdsloader.mix.sampling.registry import get_sampling_strategy, strategy_users

__all__ = [
    "EpochLengthPolicy",
    "MultiDataLoaderConfig",
    "SamplingStrategy",
    "epoch_schedule",
    "epoch_steps",
]


@dataclass(frozen=True, kw_only=True)
class MultiDataLoaderConfig:
    """The schedule of a :class:`~wdsloader.mix.MultiDataLoader`.

    - ``SEQUENTIAL``: the loaders one after another. ``SUM_OF_LENGTHS``: each for its own length;
      ``MAX``/``MIN_OF_LENGTHS``: each for the longest/shortest length; ``FIXED_NUM_STEPS``:
      ``steps_per_epoch`` split equally (the first loaders take one more when it does not divide).
    - ``ROUND_ROBIN``: ``burst_size`` steps of each loader in turn until the epoch's steps (sum,
      max or min of the lengths, or ``steps_per_epoch``).
    - ``WEIGHTED``: each loader gets exactly its largest-remainder quota of the epoch's steps
      (sum, max of the finite or min of the lengths, or ``steps_per_epoch``). Without
      ``choice_rng_seed`` the order is **deterministic**: the quotas interleaved evenly (in bursts
      of ``burst_size`` steps). With ``choice_rng_seed`` the same quotas come in a **seeded random
      order** (a permutation of the bursts drawn from ``(choice_rng_seed, epoch)``, the same on
      every rank). The counts are exact either way; nothing is drawn independently per step.
    - ``ALTERNATING``: ``alternating_pattern`` (loader indices) repeated, ``burst_size`` steps per
      entry, until the epoch's steps (``SUM_OF_LENGTHS`` or ``steps_per_epoch``).

    A loader without a length (an infinite one) needs ``FIXED_NUM_STEPS`` (``WEIGHTED`` with
    ``MAX_OF_LENGTHS`` takes the longest finite one). ``cycle_short_loaders`` restarts a loader
    that runs out within the epoch; without it the loader's remaining steps are left out (the
    epoch gets shorter, the same on every rank). ``dataloader_names`` default to ``dl0, dl1, ...``.
    Options the chosen strategy or policy would not use are a ValueError naming them.
    Strategies and policies may be given as their enum or its value (``"weighted"``); a
    strategy registered with :func:`~wdsloader.mix.sampling.register_sampling_strategy` by its
    name (kept as a str).
    """

    sampling_strategy: SamplingStrategy | str = SamplingStrategy.ROUND_ROBIN
    dataloader_weights: Sequence[float] | None = None
    alternating_pattern: Sequence[int] | None = None
    dataloader_names: Sequence[str] = field(default_factory=tuple)
    epoch_length_policy: EpochLengthPolicy = EpochLengthPolicy.SUM_OF_LENGTHS
    steps_per_epoch: int | None = None
    cycle_short_loaders: bool = True
    burst_size: int = 1
    choice_rng_seed: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "sampling_strategy", _strategy_value(self.sampling_strategy))
        set_(self, "epoch_length_policy", _enum(EpochLengthPolicy, self.epoch_length_policy))
        policy = self.epoch_length_policy
        set_(self, "burst_size", as_int(self.burst_size, "burst_size", 1))
        if not isinstance(self.cycle_short_loaders, bool):
            raise ValueError(
                f"cycle_short_loaders must be a bool, got {self.cycle_short_loaders!r}"
            )
        names = self.dataloader_names
        if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"dataloader_names must be a list of non-empty strings, got {names!r}")
        set_(self, "dataloader_names", tuple(names))
        if policy is EpochLengthPolicy.FIXED_NUM_STEPS:
            if self.steps_per_epoch is None:
                raise ValueError("steps_per_epoch required for FIXED_NUM_STEPS")
            set_(self, "steps_per_epoch", as_int(self.steps_per_epoch, "steps_per_epoch", 0))
        elif self.steps_per_epoch is not None:
            raise ValueError(
                f"steps_per_epoch={self.steps_per_epoch} would be unused: it sets the epoch "
                f"length only with FIXED_NUM_STEPS (epoch_length_policy is {policy.name})"
            )
        self._check_strategy_options()

    @property
    def strategy(self) -> LoaderSampling:
        """The registered strategy that ``sampling_strategy`` names."""
        return get_sampling_strategy(_strategy_name(self.sampling_strategy))

    def _check_strategy_options(self) -> None:
        """ValueError for an option the strategy would not use; the strategy checks its own."""
        strategy = self.strategy
        for name in STRATEGY_OPTIONS:
            if name not in strategy.options and getattr(self, name) is not None:
                users = " or ".join(strategy_users(name))
                raise ValueError(
                    f"{name} would be unused: it applies to the {users} strategy only "
                    f"(sampling_strategy is {strategy.label})"
                )
        for name, value in strategy.configure(self).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (what a saved state is checked against)."""
        return {
            "sampling_strategy": _strategy_name(self.sampling_strategy),
            "dataloader_weights": _opt_list(self.dataloader_weights),
            "alternating_pattern": _opt_list(self.alternating_pattern),
            "dataloader_names": list(self.dataloader_names),
            "epoch_length_policy": self.epoch_length_policy.value,
            "steps_per_epoch": self.steps_per_epoch,
            "cycle_short_loaders": self.cycle_short_loaders,
            "burst_size": self.burst_size,
            "choice_rng_seed": self.choice_rng_seed,
        }

    def check_loaders(self, n: int) -> tuple[str, ...]:
        """The names of ``n`` loaders under this config (checked against the other options)."""
        names = tuple(self.dataloader_names)
        if names and len(names) != n:
            raise ValueError(
                f"Number of dataloader names ({len(names)}) doesn't match number of loaders ({n})"
            )
        if not names:
            names = tuple(f"dl{i}" for i in range(n))
        if len(set(names)) != len(names):
            dup = sorted({x for x in names if names.count(x) > 1})
            raise ValueError(f"Dataloader names must be unique: {list(names)} repeats {dup}")
        weights = self.dataloader_weights
        if weights is not None and len(weights) != n:
            raise ValueError(
                "Number of dataloader_weights must match number of loaders: "
                f"got {len(weights)} weights for {n} loaders"
            )
        for i, v in enumerate(self.alternating_pattern or ()):
            if v >= n:
                raise ValueError(
                    f"alternating_pattern[{i}] = {v} is not the index of one of the {n} loaders"
                )
        return names


def _strategy_name(value: SamplingStrategy | str) -> str:
    return value.value if isinstance(value, SamplingStrategy) else value


def _strategy_value(value: Any) -> SamplingStrategy | str:
    """A built-in strategy as its enum, another registered one as its name."""
    if isinstance(value, SamplingStrategy):
        return value
    if isinstance(value, str):
        get_sampling_strategy(value)  # ValueError listing the registered ones
        try:
            return SamplingStrategy(value)
        except ValueError:
            return value
    raise ValueError(f"SamplingStrategy: unknown value {value!r}")


def _enum(kind: type[Enum], value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(m.name for m in kind)
        raise ValueError(f"{kind.__name__}: unknown value {value!r}; valid: {valid}") from None


def _opt_list(v: Sequence[Any] | None) -> list[Any] | None:
    return None if v is None else list(v)


# ------------------------------------------------------------------------------------ schedule


def epoch_steps(config: MultiDataLoaderConfig, lengths: Lengths) -> int:
    """Schedule slots of an epoch (before ``cycle_short_loaders=False`` drops any)."""
    names = config.check_loaders(len(lengths))
    if config.epoch_length_policy is EpochLengthPolicy.FIXED_NUM_STEPS:
        return int(config.steps_per_epoch or 0)
    return config.strategy.epoch_steps(config, lengths, names)


def epoch_schedule(config: MultiDataLoaderConfig, lengths: Lengths, epoch: int = 0) -> np.ndarray:
    """The loader index of every step of ``epoch`` (int64), from the config and the loaders'
    lengths (``None`` for a loader without one): the same on every rank that has the same
    lengths. With ``cycle_short_loaders=False`` a loader's steps beyond its length are left out.
    """
    epoch = as_int(epoch, "epoch", 0)
    total = epoch_steps(config, lengths)
    strategy = config.strategy
    sched = np.asarray(strategy.schedule(config, lengths, total, epoch))
    n = len(lengths)
    if (
        sched.shape != (total,)
        or (sched.size and sched.dtype.kind not in "iu")
        or (sched.size and not 0 <= int(sched.min()) <= int(sched.max()) < n)
    ):
        raise ValueError(
            f"sampling strategy {strategy.label!r} gave a schedule of shape {sched.shape} "
            f"({sched.dtype}) for epoch {epoch}; expected {total} loader indices in [0, {n})"
        )
    sched = sched.astype(np.int64, copy=False)
    if not config.cycle_short_loaders:
        sched = _without_overrun(sched, lengths)
    return sched


def _without_overrun(sched: np.ndarray, lengths: Lengths) -> np.ndarray:
    """``sched`` without each loader's steps past its length."""
    limit = np.asarray([math.inf if n is None else n for n in lengths], dtype=np.float64)
    out: np.ndarray = sched[occurrence(sched, len(lengths)) < limit[sched]]
    return out


def occurrence(sched: np.ndarray, n: int) -> np.ndarray:
    """For each step, how many earlier steps drew from the same loader (int64)."""
    order = np.argsort(sched, kind="stable")
    counts = np.bincount(sched, minlength=n)
    first = np.cumsum(counts) - counts
    nth = np.empty(sched.size, dtype=np.int64)
    nth[order] = np.arange(sched.size, dtype=np.int64) - first[sched[order]]
    return nth
