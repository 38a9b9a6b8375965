"""Random access to built shards: :class:`ShardDataset` (by index and by key), and
:class:`MixedShardDataset` over the sources of a mix (by source and index)."""

from wdsloader.access.dataset import ShardDataset
from wdsloader.access.mixed import MixedShardDataset

__all__ = ["MixedShardDataset", "ShardDataset"]
