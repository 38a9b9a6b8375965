"""Mixing several datasets: loaders on a schedule (:class:`MultiDataLoader`)."""

from wdsloader.mix.multi import MixStep, MultiDataLoader
from wdsloader.mix.schedule import (
    EpochLengthPolicy,
    MultiDataLoaderConfig,
    SamplingStrategy,
    epoch_schedule,
    epoch_steps,
)

__all__ = [
    "EpochLengthPolicy",
    "MixStep",
    "MultiDataLoader",
    "MultiDataLoaderConfig",
    "SamplingStrategy",
    "epoch_schedule",
    "epoch_steps",
]
