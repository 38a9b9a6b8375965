"""``ALTERNATING``: a pattern of loader indices repeated."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.mix.sampling.base import BaseSampling, EpochLengthPolicy, Lengths, cyclic

if TYPE_CHECKING:
    from wdsloader.mix.schedule import MultiDataLoaderConfig


class Alternating(BaseSampling):
    """``alternating_pattern`` (loader indices) repeated, ``burst_size`` steps per entry, until
    the epoch's steps (``SUM_OF_LENGTHS`` or ``steps_per_epoch``)."""

    name = "alternating"
    label = "ALTERNATING"
    options = frozenset({"alternating_pattern"})

    def configure(self, config: MultiDataLoaderConfig) -> dict[str, Any]:
        pattern = config.alternating_pattern
        if pattern is None or isinstance(pattern, str) or len(pattern) == 0:
            raise ValueError(
                "Pattern required for ALTERNATING strategy (alternating_pattern, a non-empty "
                "list of loader indices)"
            )
        policy = config.epoch_length_policy
        if policy in (EpochLengthPolicy.MAX_OF_LENGTHS, EpochLengthPolicy.MIN_OF_LENGTHS):
            raise ValueError(
                f"ALTERNATING takes its length from SUM_OF_LENGTHS or FIXED_NUM_STEPS, "
                f"not {policy.name}"
            )
        return {
            "alternating_pattern": tuple(
                as_int(v, f"alternating_pattern[{i}]", 0) for i, v in enumerate(pattern)
            )
        }

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray:
        assert config.alternating_pattern is not None
        return cyclic(config.alternating_pattern, config.burst_size, total)


ALTERNATING = Alternating()
