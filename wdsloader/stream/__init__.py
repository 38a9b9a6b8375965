"""Execution: create_loader and its option objects, the loader and its resume state, the per-worker dataset, the control
block shared with workers, worker-death detection, the start-method check and the device
prefetcher."""

from wdsloader.stream.config import LoaderConfig
from wdsloader.stream.dataset import ShardStreamDataset
from wdsloader.stream.device_images import DeviceImageDecoder, register_device_image_decoder
from wdsloader.stream.loader import DevicePrefetcher, WdsDataLoader, create_loader, set_epoch
from wdsloader.stream.loader_options import LoaderOptions
from wdsloader.stream.options import (
    DecodeOptions,
    ErrorPolicy,
    PlanOptions,
    Topology,
    WorkerOptions,
)
from wdsloader.stream.replay import StepSamples
from wdsloader.stream.state import LoaderState, ResumePoint
from wdsloader.stream.telemetry import LoggingReporter, TensorBoardReporter

__all__ = [
    "DecodeOptions",
    "DeviceImageDecoder",
    "DevicePrefetcher",
    "ErrorPolicy",
    "LoaderConfig",
    "LoaderOptions",
    "LoaderState",
    "LoggingReporter",
    "PlanOptions",
    "ResumePoint",
    "ShardStreamDataset",
    "StepSamples",
    "TensorBoardReporter",
    "Topology",
    "WdsDataLoader",
    "WorkerOptions",
    "create_loader",
    "register_device_image_decoder",
    "set_epoch",
]
