"""``ROUND_ROBIN``: ``burst_size`` steps of each loader in turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from wdsloader.mix.sampling.base import BaseSampling, Lengths, cyclic

if TYPE_CHECKING:
    from wdsloader.mix.schedule import MultiDataLoaderConfig


class RoundRobin(BaseSampling):
    """``burst_size`` steps of each loader in turn until the epoch's steps (sum, max or min of
    the lengths, or ``steps_per_epoch``)."""

    name = "round_robin"
    label = "ROUND_ROBIN"

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray:
        return cyclic(range(len(lengths)), config.burst_size, total)


ROUND_ROBIN = RoundRobin()
