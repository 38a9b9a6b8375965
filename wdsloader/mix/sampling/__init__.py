"""Loader-level sampling strategies of :class:`~wdsloader.mix.MultiDataLoader`: one module per
strategy (sequential, round robin, weighted, alternating) behind a registry keyed by name."""

from wdsloader.mix.sampling.base import (
    STRATEGY_OPTIONS,
    BaseSampling,
    EpochLengthPolicy,
    LoaderSampling,
    SamplingStrategy,
)
from wdsloader.mix.sampling.registry import (
    get_sampling_strategy,
    register_sampling_strategy,
    sampling_strategies,
    unregister_sampling_strategy,
)

__all__ = [
    "STRATEGY_OPTIONS",
    "BaseSampling",
    "EpochLengthPolicy",
    "LoaderSampling",
    "SamplingStrategy",
    "get_sampling_strategy",
    "register_sampling_strategy",
    "sampling_strategies",
    "unregister_sampling_strategy",
]
