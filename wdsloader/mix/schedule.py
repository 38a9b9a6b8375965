"""Which loader each step of an epoch draws from: strategies, epoch-length policies, the config,
and the schedule as a pure function of the config, the loaders' lengths and the epoch.

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
from wdsloader.plan.quotas import even_interleave, largest_remainder

__all__ = [
    "EpochLengthPolicy",
    "MultiDataLoaderConfig",
    "SamplingStrategy",
    "epoch_schedule",
    "epoch_steps",
]

_CHOICE_TAG = 0x0C40_1CE5  # mixed into the seeded order's seed: part of the resume contract


class SamplingStrategy(str, Enum):
    """How steps are shared among loaders (see :class:`MultiDataLoaderConfig`)."""

    SEQUENTIAL = "sequential"
    ROUND_ROBIN = "round_robin"
    WEIGHTED = "weighted"
    ALTERNATING = "alternating"


class EpochLengthPolicy(str, Enum):
    """How many steps an epoch has, from the loaders' lengths (or ``steps_per_epoch``)."""

    SUM_OF_LENGTHS = "sum_of_lengths"
    MAX_OF_LENGTHS = "max_of_lengths"
    MIN_OF_LENGTHS = "min_of_lengths"
    FIXED_NUM_STEPS = "fixed_num_steps"


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
    Strategies and policies may be given as their enum or its value (``"weighted"``).
    """

    sampling_strategy: SamplingStrategy = SamplingStrategy.ROUND_ROBIN
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
        set_(self, "sampling_strategy", _enum(SamplingStrategy, self.sampling_strategy))
        set_(self, "epoch_length_policy", _enum(EpochLengthPolicy, self.epoch_length_policy))
        strategy, policy = self.sampling_strategy, self.epoch_length_policy
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
        self._check_strategy_options(strategy, policy)

    def _check_strategy_options(
        self, strategy: SamplingStrategy, policy: EpochLengthPolicy
    ) -> None:
        set_ = object.__setattr__
        if strategy is SamplingStrategy.WEIGHTED:
            if self.dataloader_weights is None:
                raise ValueError("Weights required for WEIGHTED strategy (dataloader_weights)")
            weights = self.dataloader_weights
            if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
                raise ValueError(f"dataloader_weights must be a list of numbers, got {weights!r}")
            largest_remainder(weights, 0, what="dataloader_weights")  # checks them
            set_(self, "dataloader_weights", tuple(float(w) for w in weights))
            if self.choice_rng_seed is not None:
                set_(self, "choice_rng_seed", as_int(self.choice_rng_seed, "choice_rng_seed", 0))
        else:
            for name in ("dataloader_weights", "choice_rng_seed"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} would be unused: it applies to the WEIGHTED strategy only "
                        f"(sampling_strategy is {strategy.name})"
                    )
        if strategy is SamplingStrategy.ALTERNATING:
            pattern = self.alternating_pattern
            if pattern is None or isinstance(pattern, str) or len(pattern) == 0:
                raise ValueError(
                    "Pattern required for ALTERNATING strategy (alternating_pattern, a non-empty "
                    "list of loader indices)"
                )
            set_(
                self,
                "alternating_pattern",
                tuple(as_int(v, f"alternating_pattern[{i}]", 0) for i, v in enumerate(pattern)),
            )
            if policy in (EpochLengthPolicy.MAX_OF_LENGTHS, EpochLengthPolicy.MIN_OF_LENGTHS):
                raise ValueError(
                    f"ALTERNATING takes its length from SUM_OF_LENGTHS or FIXED_NUM_STEPS, "
                    f"not {policy.name}"
                )
        elif self.alternating_pattern is not None:
            raise ValueError(
                f"alternating_pattern would be unused: it applies to the ALTERNATING strategy "
                f"only (sampling_strategy is {strategy.name})"
            )
        if strategy is SamplingStrategy.SEQUENTIAL and self.burst_size != 1:
            raise ValueError(
                f"burst_size={self.burst_size} would be unused: SEQUENTIAL runs each loader "
                "for its whole share"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (what a saved state is checked against)."""
        return {
            "sampling_strategy": self.sampling_strategy.value,
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


def _enum(kind: type[Enum], value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(m.name for m in kind)
        raise ValueError(f"{kind.__name__}: unknown value {value!r}; valid: {valid}") from None


def _opt_list(v: Sequence[Any] | None) -> list[Any] | None:
    return None if v is None else list(v)


# ------------------------------------------------------------------------------------ schedule

Lengths = Sequence[int | None]  # None: a loader without a length (infinite)


def _finite(lengths: Lengths, names: Sequence[str], why: str) -> list[int]:
    bad = [names[i] for i, n in enumerate(lengths) if n is None]
    if bad:
        raise ValueError(f"{why}: loaders {bad} have no length; use FIXED_NUM_STEPS")
    return [int(n) for n in lengths if n is not None]


def epoch_steps(config: MultiDataLoaderConfig, lengths: Lengths) -> int:
    """Schedule slots of an epoch (before ``cycle_short_loaders=False`` drops any)."""
    names = config.check_loaders(len(lengths))
    strategy, policy = config.sampling_strategy, config.epoch_length_policy
    if policy is EpochLengthPolicy.FIXED_NUM_STEPS:
        return int(config.steps_per_epoch or 0)
    why = f"{strategy.name} with {policy.name}"
    if strategy is SamplingStrategy.WEIGHTED and policy is EpochLengthPolicy.MAX_OF_LENGTHS:
        finite = [n for n in lengths if n is not None]
        if not finite:
            raise ValueError(f"{why}: no loader has a length; use FIXED_NUM_STEPS")
        return max(finite)
    finite = _finite(lengths, names, why)
    n = len(finite)
    if policy is EpochLengthPolicy.SUM_OF_LENGTHS:
        return sum(finite)
    longest_or_shortest = max(finite) if policy is EpochLengthPolicy.MAX_OF_LENGTHS else min(finite)
    return (
        longest_or_shortest * n if strategy is SamplingStrategy.SEQUENTIAL else longest_or_shortest
    )


def _bursts(units: np.ndarray, quotas: np.ndarray, burst: int) -> np.ndarray:
    """Each unit's loader for ``burst`` steps (a loader's last unit for what its quota leaves)."""
    if burst == 1:
        return units
    seen = np.zeros(quotas.size, dtype=np.int64)
    out = []
    for u in units.tolist():
        size = min(burst, int(quotas[u] - seen[u]))
        seen[u] += size
        out.append(np.full(size, u, dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _weighted(config: MultiDataLoaderConfig, total: int, epoch: int) -> np.ndarray:
    assert config.dataloader_weights is not None
    quotas = largest_remainder(config.dataloader_weights, total, what="dataloader_weights")
    burst = config.burst_size
    units = -(-quotas // burst)  # bursts per loader, the last one possibly short
    if config.choice_rng_seed is None:
        order = even_interleave(units)
    else:
        seq = np.random.SeedSequence([config.choice_rng_seed, epoch, _CHOICE_TAG])
        order = np.random.default_rng(seq).permutation(np.repeat(np.arange(units.size), units))
    return _bursts(order, quotas, burst)


def _cyclic(entries: Sequence[int], burst: int, total: int) -> np.ndarray:
    reps = -(-total // (burst * len(entries))) if total else 0
    return np.repeat(np.tile(np.asarray(entries, np.int64), reps), burst)[:total]


def epoch_schedule(config: MultiDataLoaderConfig, lengths: Lengths, epoch: int = 0) -> np.ndarray:
    """The loader index of every step of ``epoch`` (int64), from the config and the loaders'
    lengths (``None`` for a loader without one): the same on every rank that has the same
    lengths. With ``cycle_short_loaders=False`` a loader's steps beyond its length are left out.
    """
    epoch = as_int(epoch, "epoch", 0)
    total = epoch_steps(config, lengths)
    n = len(lengths)
    strategy = config.sampling_strategy
    if strategy is SamplingStrategy.SEQUENTIAL:
        if config.epoch_length_policy is EpochLengthPolicy.SUM_OF_LENGTHS:
            shares = np.asarray(lengths, dtype=np.int64)
        else:
            shares = total // n + (np.arange(n) < total % n)
        sched = np.repeat(np.arange(n, dtype=np.int64), shares)
    elif strategy is SamplingStrategy.ROUND_ROBIN:
        sched = _cyclic(range(n), config.burst_size, total)
    elif strategy is SamplingStrategy.WEIGHTED:
        sched = _weighted(config, total, epoch)
    else:
        assert config.alternating_pattern is not None
        sched = _cyclic(config.alternating_pattern, config.burst_size, total)
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
