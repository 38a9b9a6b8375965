"""What a loader-level sampling strategy of :class:`~wdsloader.mix.MultiDataLoader` is: the
:class:`LoaderSampling` protocol, :class:`BaseSampling` with the common epoch-length rules, and the
enums of the built-in strategies and of the epoch-length policies."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from wdsloader.mix.schedule import MultiDataLoaderConfig

Lengths = Sequence[int | None]  # None: a loader without a length (infinite)

STRATEGY_OPTIONS = ("dataloader_weights", "choice_rng_seed", "alternating_pattern")
"""The config's options that only some strategies use (a strategy lists those it reads)."""


class SamplingStrategy(str, Enum):
    """The built-in strategies: how steps are shared among loaders (see
    :class:`~wdsloader.mix.MultiDataLoaderConfig`)."""

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


@runtime_checkable
class LoaderSampling(Protocol):
    """A loader-level sampling strategy, registered under ``name`` (what
    ``MultiDataLoaderConfig(sampling_strategy=...)`` names).

    ``label``: its name in messages. ``options``: which of :data:`STRATEGY_OPTIONS` it reads
    (setting another is a ValueError). ``configure`` checks the config's options for it and
    returns the normalised values to store (``{}`` for none). ``epoch_steps``: the schedule slots
    of an epoch under a policy other than ``FIXED_NUM_STEPS``. ``schedule``: the loader index
    of each of ``total`` steps of ``epoch`` (int64), a pure function of its arguments, so every
    rank computes the same one.
    """

    name: str
    label: str
    options: frozenset[str]

    def configure(self, config: MultiDataLoaderConfig) -> dict[str, Any]: ...

    def epoch_steps(
        self, config: MultiDataLoaderConfig, lengths: Lengths, names: Sequence[str]
    ) -> int: ...

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray: ...


def finite(lengths: Lengths, names: Sequence[str], why: str) -> list[int]:
    """The lengths, or a ValueError naming the loaders without one."""
    bad = [names[i] for i, n in enumerate(lengths) if n is None]
    if bad:
        raise ValueError(f"{why}: loaders {bad} have no length; use FIXED_NUM_STEPS")
    return [int(n) for n in lengths if n is not None]


class BaseSampling:
    """Defaults for a strategy: no options, and the epoch lengths of the policies (the sum,
    the longest or the shortest of the loaders' lengths; every loader needs one)."""

    name = ""
    label = ""
    options: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("label"):
            cls.label = cls.name

    def configure(self, config: MultiDataLoaderConfig) -> dict[str, Any]:
        return {}

    def why(self, config: MultiDataLoaderConfig) -> str:
        """How errors about the epoch length name the strategy and policy."""
        return f"{self.label} with {EpochLengthPolicy(config.epoch_length_policy).name}"

    def epoch_steps(
        self, config: MultiDataLoaderConfig, lengths: Lengths, names: Sequence[str]
    ) -> int:
        policy = config.epoch_length_policy
        lens = finite(lengths, names, self.why(config))
        if policy is EpochLengthPolicy.SUM_OF_LENGTHS:
            return sum(lens)
        return max(lens) if policy is EpochLengthPolicy.MAX_OF_LENGTHS else min(lens)

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray:
        raise NotImplementedError


def cyclic(entries: Sequence[int], burst: int, total: int) -> np.ndarray:
    """``entries`` repeated, ``burst`` steps each, cut to ``total`` steps."""
    reps = -(-total // (burst * len(entries))) if total else 0
    return np.repeat(np.tile(np.asarray(entries, np.int64), reps), burst)[:total]
