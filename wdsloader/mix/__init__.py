"""Mixing several datasets: loaders on a schedule (:class:`MultiDataLoader`), and weighted
sources mixed sample by sample (:class:`Source`, planned by :mod:`wdsloader.plan.mix`)."""

from wdsloader.mix.multi import MixStep, MultiDataLoader
from wdsloader.mix.schedule import (
    EpochLengthPolicy,
    MultiDataLoaderConfig,
    SamplingStrategy,
    epoch_schedule,
    epoch_steps,
)
from wdsloader.mix.source import Source, mix_epoch, mix_names, mix_quotas_for
from wdsloader.mix.spec import MIX_ALGORITHM, MixSpec

__all__ = [
    "MIX_ALGORITHM",
    "EpochLengthPolicy",
    "MixSpec",
    "MixStep",
    "MultiDataLoader",
    "MultiDataLoaderConfig",
    "SamplingStrategy",
    "Source",
    "epoch_schedule",
    "epoch_steps",
    "mix_epoch",
    "mix_names",
    "mix_quotas_for",
]
