"""wdsloader: stream WebDataset shards into PyTorch with exact DDP splitting and exact resume.

The read side of the project; :mod:`wdsloader.format` is the on-disk contract that
``build_shards`` writes. Names are imported on first use, so ``import wdsloader`` (and the
format layer the builder uses) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "get_collator": "wdsloader.collate",
    "list_collators": "wdsloader.collate",
    "register_collator": "wdsloader.collate",
    "Curriculum": "wdsloader.curriculum",
    "Schedule": "wdsloader.curriculum",
    "ShardStreamDataset": "wdsloader.dataset",
    "SampleDecoder": "wdsloader.decode",
    "get_decoder": "wdsloader.decode",
    "parse_sample": "wdsloader.decode",
    "register_decoder": "wdsloader.decode",
    "DecodeError": "wdsloader.errors",
    "ManifestError": "wdsloader.errors",
    "PickleNotAllowedError": "wdsloader.errors",
    "SchemaError": "wdsloader.errors",
    "ShardFormatError": "wdsloader.errors",
    "SkipLimitError": "wdsloader.errors",
    "StateMismatchError": "wdsloader.errors",
    "WdsLoaderError": "wdsloader.errors",
    "WorkerDiedError": "wdsloader.errors",
    "ReadOptions": "wdsloader.fetch",
    "ShardStore": "wdsloader.fetch",
    "FieldSpec": "wdsloader.format",
    "Manifest": "wdsloader.format",
    "ShardInfo": "wdsloader.format",
    "SplitInfo": "wdsloader.format",
    "DevicePrefetcher": "wdsloader.loader",
    "WdsDataLoader": "wdsloader.loader",
    "create_loader": "wdsloader.loader",
    "set_epoch": "wdsloader.loader",
    "PlanConfig": "wdsloader.plan",
    "Resume": "wdsloader.plan",
    "BatchValidationError": "wdsloader.validate",
    "ValidationReport": "wdsloader.dataset_check",
    "validate_batch": "wdsloader.validate",
    "validate_dataset": "wdsloader.dataset_check",
    "validate_first_batch": "wdsloader.validate",
}

__all__ = [
    "BatchValidationError",
    "Curriculum",
    "DecodeError",
    "DevicePrefetcher",
    "FieldSpec",
    "Manifest",
    "ManifestError",
    "PickleNotAllowedError",
    "PlanConfig",
    "ReadOptions",
    "Resume",
    "Schedule",
    "SampleDecoder",
    "SchemaError",
    "ShardFormatError",
    "ShardInfo",
    "ShardStore",
    "ShardStreamDataset",
    "SkipLimitError",
    "SplitInfo",
    "StateMismatchError",
    "ValidationReport",
    "WdsDataLoader",
    "WdsLoaderError",
    "WorkerDiedError",
    "create_loader",
    "get_collator",
    "get_decoder",
    "list_collators",
    "parse_sample",
    "register_collator",
    "register_decoder",
    "set_epoch",
    "validate_batch",
    "validate_dataset",
    "validate_first_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wdsloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.collate import get_collator, list_collators, register_collator
    from wdsloader.curriculum import Curriculum, Schedule
    from wdsloader.dataset import ShardStreamDataset
    from wdsloader.dataset_check import ValidationReport, validate_dataset
    from wdsloader.decode import SampleDecoder, get_decoder, parse_sample, register_decoder
    from wdsloader.errors import (
        DecodeError,
        ManifestError,
        PickleNotAllowedError,
        SchemaError,
        ShardFormatError,
        SkipLimitError,
        StateMismatchError,
        WdsLoaderError,
        WorkerDiedError,
    )
    from wdsloader.fetch import ReadOptions, ShardStore
    from wdsloader.format import FieldSpec, Manifest, ShardInfo, SplitInfo
    from wdsloader.loader import DevicePrefetcher, WdsDataLoader, create_loader, set_epoch
    from wdsloader.plan import PlanConfig, Resume
    from wdsloader.validate import BatchValidationError, validate_batch, validate_first_batch
