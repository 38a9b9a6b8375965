"""How a mix deals an epoch into batches: one strategy per module behind a registry of names.

``batching="mixed"`` (:mod:`~wdsloader.plan.batching.mixed`) shuffles the sources together and
resumes elastically; ``"stratified"`` (:mod:`~wdsloader.plan.batching.stratified`) gives every
global batch each source's exact share and resumes on the same topology only. A new strategy
implements :class:`BatchingStrategy` (or, filling each global batch on its own, subclasses
:class:`GlobalBatching`) and is registered by name with :func:`register_batching`; the mix
options of :func:`~wdsloader.create_loader` then accept ``batching=name``. Pure, like the rest
of :mod:`wdsloader.plan`.
"""

from wdsloader.plan.batching.base import (
    BUILTIN_BATCHINGS,
    TOPOLOGY,
    BatchingStrategy,
    MixBatchIds,
    MixTopology,
    batching_names,
    batching_strategy,
    register_batching,
    same_topology_done,
    unregister_batching,
)
from wdsloader.plan.batching.global_batches import (
    GlobalBatches,
    GlobalBatching,
    Slots,
    global_batch_count,
)
from wdsloader.plan.batching.mixed import MixedBatches, MixedBatching, mix_plan_config
from wdsloader.plan.batching.stratified import StratifiedBatching

__all__ = [
    "BUILTIN_BATCHINGS",
    "TOPOLOGY",
    "BatchingStrategy",
    "GlobalBatches",
    "GlobalBatching",
    "MixBatchIds",
    "MixTopology",
    "MixedBatches",
    "MixedBatching",
    "Slots",
    "StratifiedBatching",
    "batching_names",
    "batching_strategy",
    "global_batch_count",
    "mix_plan_config",
    "register_batching",
    "same_topology_done",
    "unregister_batching",
]

register_batching("mixed", MixedBatching())
register_batching("stratified", StratifiedBatching())
