"""Random access to built shards: :class:`ShardDataset` (by index and by key)."""

from wdsloader.access.dataset import ShardDataset

__all__ = ["ShardDataset"]
