"""``SEQUENTIAL``: the loaders one after another, each for its whole share of the epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.mix.sampling.base import BaseSampling, EpochLengthPolicy, Lengths

if TYPE_CHECKING:
    from wdsloader.mix.schedule import MultiDataLoaderConfig


class Sequential(BaseSampling):
    """``SUM_OF_LENGTHS``: each loader for its own length; ``MAX``/``MIN_OF_LENGTHS``: each
    for the longest/shortest length; ``FIXED_NUM_STEPS``: ``steps_per_epoch`` split equally
    (the first loaders take one more when it does not divide)."""

    name = "sequential"
    label = "SEQUENTIAL"

    def configure(self, config: MultiDataLoaderConfig) -> dict[str, Any]:
        if config.burst_size != 1:
            raise ValueError(
                f"burst_size={config.burst_size} would be unused: SEQUENTIAL runs each loader "
                "for its whole share"
            )
        return {}

    def epoch_steps(
        self, config: MultiDataLoaderConfig, lengths: Lengths, names: Sequence[str]
    ) -> int:
        steps = super().epoch_steps(config, lengths, names)
        if config.epoch_length_policy is EpochLengthPolicy.SUM_OF_LENGTHS:
            return steps
        return steps * len(lengths)

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray:
        n = len(lengths)
        if config.epoch_length_policy is EpochLengthPolicy.SUM_OF_LENGTHS:
            shares = np.asarray(lengths, dtype=np.int64)
        else:
            shares = total // n + (np.arange(n) < total % n)
        return np.repeat(np.arange(n, dtype=np.int64), shares)


SEQUENTIAL = Sequential()
