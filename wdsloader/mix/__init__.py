"""Mixing several datasets: loaders on a schedule (:class:`MultiDataLoader`), and weighted
sources mixed sample by sample (a :class:`Mix` of :class:`MixSource`, planned by
:mod:`wdsloader.plan.mix` and dealt into batches by a registered :class:`BatchingStrategy`)."""

from wdsloader.lazy import moved_names
from wdsloader.mix.mix_file import load_mix, mix_from_dict, mix_to_dict
from wdsloader.mix.multi import MixStep, MultiDataLoader
from wdsloader.mix.multi_state import LoaderProgress, MultiState
from wdsloader.mix.options import Mix
from wdsloader.mix.sampling import (
    BaseSampling,
    LoaderSampling,
    register_sampling_strategy,
    unregister_sampling_strategy,
)
from wdsloader.mix.schedule import (
    EpochLengthPolicy,
    MultiDataLoaderConfig,
    SamplingStrategy,
    epoch_schedule,
    epoch_steps,
)
from wdsloader.mix.source import MixSource, mix_epoch, mix_names, mix_quotas_for
from wdsloader.mix.spec import MIX_ALGORITHM, MixSpec
from wdsloader.plan.batching import (
    BatchingStrategy,
    GlobalBatching,
    register_batching_strategy,
    unregister_batching_strategy,
)

__all__ = [
    "MIX_ALGORITHM",
    "BaseSampling",
    "BatchingStrategy",
    "EpochLengthPolicy",
    "GlobalBatching",
    "Mix",
    "LoaderProgress",
    "LoaderSampling",
    "MixSpec",
    "MixStep",
    "MultiDataLoader",
    "MultiDataLoaderConfig",
    "MultiState",
    "SamplingStrategy",
    "MixSource",
    "epoch_schedule",
    "epoch_steps",
    "load_mix",
    "mix_epoch",
    "mix_from_dict",
    "mix_names",
    "mix_quotas_for",
    "mix_to_dict",
    "register_batching_strategy",
    "register_sampling_strategy",
    "unregister_batching_strategy",
    "unregister_sampling_strategy",
]

# ``Source``: MixSource's old name, until 0.2.0 (``build_shards.Source`` is a build input).
__getattr__ = moved_names(__name__, {"Source": ("wdsloader.mix", "MixSource")})
