"""How a mix deals an epoch into batches: one strategy per module behind a registry of names.

``batching="mixed"`` (:mod:`~wdsloader.plan.batching.mixed`) shuffles the sources together and
resumes elastically; ``"stratified"`` (:mod:`~wdsloader.plan.batching.stratified`) gives every
global batch each source's exact share and resumes on the same topology only. A new strategy
implements :class:`BatchingStrategy` (or, filling each global batch on its own, subclasses
:class:`GlobalBatching`) and is registered under its name with
:func:`register_batching_strategy`; the mix options of :func:`~wdsloader.create_loader` then accept ``batching=name``. Pure, like the rest
of :mod:`wdsloader.plan`.
"""

from wdsloader.plan.batching.base import (
    BUILTIN_BATCHINGS,
    TOPOLOGY,
    BatchingStrategy,
    MixBatchIds,
    MixTopology,
    batching_strategies,
    get_batching_strategy,
    register_batching_strategy,
    same_topology_done,
    unregister_batching_strategy,
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
    "batching_strategies",
    "get_batching_strategy",
    "global_batch_count",
    "mix_plan_config",
    "register_batching_strategy",
    "same_topology_done",
    "unregister_batching_strategy",
]

register_batching_strategy(MixedBatching())
register_batching_strategy(StratifiedBatching())
