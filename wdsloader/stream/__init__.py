"""Execution: create_loader, the loader and its resume state, the per-worker dataset, the control
block shared with workers, worker-death detection, the start-method check and the device
prefetcher."""

from wdsloader.stream.config import LoaderConfig
from wdsloader.stream.dataset import ShardStreamDataset
from wdsloader.stream.loader import DevicePrefetcher, WdsDataLoader, create_loader, set_epoch
from wdsloader.stream.state import LoaderState, ResumePoint

__all__ = [
    "DevicePrefetcher",
    "LoaderConfig",
    "LoaderState",
    "ResumePoint",
    "ShardStreamDataset",
    "WdsDataLoader",
    "create_loader",
    "set_epoch",
]
