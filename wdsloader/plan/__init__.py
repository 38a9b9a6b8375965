"""Pure planning: which sample ids each DDP rank and DataLoader worker yields, in which order.

An epoch is planned in three steps, each a module: the epoch order (:mod:`~wdsloader.plan.order`:
spans of shards in a keyed pseudo-random order, evaluated only where read), the rank and worker
partition with the per-worker window shuffle (:mod:`~wdsloader.plan.partition`), and exact or
elastic resume (:mod:`~wdsloader.plan.resume`); :mod:`~wdsloader.plan.batches` answers with the
batches of a rank or worker, and :class:`Planner` is the question as the loader asks it (one
source: :class:`SinglePlanner`; a mix of sources: :mod:`~wdsloader.plan.mix`, dealt by a
strategy of :mod:`~wdsloader.plan.batching`). Pure numpy, no I/O, no global random state: the
same inputs give the same plan on every process. A sample's global id is its position in the concatenation of the
split's shards in manifest order.
"""

from wdsloader.plan.batches import (
    epoch_dropped,
    epoch_padding,
    interleave,
    num_batches,
    rank_batches,
    worker_batches,
)
from wdsloader.plan.config import PLAN_ALGORITHM, PlanConfig
from wdsloader.plan.order import EpochOrder, KeyedPermutation, epoch_order, shard_of
from wdsloader.plan.pack_plan import PackBatches, PackPlanner
from wdsloader.plan.packing import Packing
from wdsloader.plan.partition import WorkerBatches
from wdsloader.plan.planner import Planner, SinglePlanner
from wdsloader.plan.resume import Resume, next_resume

__all__ = [
    "PLAN_ALGORITHM",
    "EpochOrder",
    "KeyedPermutation",
    "PackBatches",
    "PackPlanner",
    "Packing",
    "PlanConfig",
    "Planner",
    "Resume",
    "SinglePlanner",
    "WorkerBatches",
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
