"""Pure planning: which sample ids each DDP rank and DataLoader worker yields, in which order."""

from wdsloader.plan.sample_plan import (
    PLAN_ALGORITHM,
    PlanConfig,
    Resume,
    epoch_dropped,
    epoch_order,
    epoch_padding,
    interleave,
    next_resume,
    num_batches,
    rank_batches,
    shard_of,
    worker_batches,
)

__all__ = [
    "PLAN_ALGORITHM",
    "PlanConfig",
    "Resume",
    "epoch_dropped",
    "epoch_order",
    "epoch_padding",
    "interleave",
    "next_resume",
    "num_batches",
    "rank_batches",
    "shard_of",
    "worker_batches",
]
