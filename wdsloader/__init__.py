"""wdsloader: stream WebDataset shards into PyTorch with exact DDP splitting and exact resume.

The read side of the project; :mod:`wdsloader.format` is the on-disk contract that
``build_shards`` writes. Names are imported on first use, so ``import wdsloader`` (and the
format layer the builder uses) does not import torch.
"""

# ruff: noqa: F401 - the TYPE_CHECKING imports name what __all__ (from _EXPORTS) lists
from __future__ import annotations

from typing import TYPE_CHECKING

from wdsloader.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "get_collator": "wdsloader.collate",
    "list_collators": "wdsloader.collate",
    "register_collator": "wdsloader.collate",
    "Curriculum": "wdsloader.curriculum",
    "Schedule": "wdsloader.curriculum",
    "ShardStreamDataset": "wdsloader.stream",
    "SampleDecoder": "wdsloader.decode",
    "get_decoder": "wdsloader.decode",
    "parse_sample": "wdsloader.decode",
    "register_decoder": "wdsloader.decode",
    "DecodeError": "wdsloader.errors",
    "ManifestError": "wdsloader.errors",
    "PickleNotAllowedError": "wdsloader.errors",
    "SchemaError": "wdsloader.errors",
    "ShardFormatError": "wdsloader.errors",
    "ShardReadError": "wdsloader.errors",
    "SkipLimitError": "wdsloader.errors",
    "StateMismatchError": "wdsloader.errors",
    "WdsLoaderError": "wdsloader.errors",
    "WorkerDiedError": "wdsloader.errors",
    "ReadOptions": "wdsloader.io",
    "ShardStore": "wdsloader.io",
    "FieldSpec": "wdsloader.format",
    "Manifest": "wdsloader.format",
    "ShardInfo": "wdsloader.format",
    "SplitInfo": "wdsloader.format",
    "DevicePrefetcher": "wdsloader.stream",
    "LoaderConfig": "wdsloader.stream",
    "LoaderState": "wdsloader.stream",
    "WdsDataLoader": "wdsloader.stream",
    "create_loader": "wdsloader.stream",
    "set_epoch": "wdsloader.stream",
    "PlanConfig": "wdsloader.plan",
    "Resume": "wdsloader.plan",
    "BatchValidationError": "wdsloader.errors",
    "ValidationReport": "wdsloader.validate",
    "validate_batch": "wdsloader.validate",
    "validate_dataset": "wdsloader.validate",
    "validate_first_batch": "wdsloader.validate",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.collate import get_collator, list_collators, register_collator
    from wdsloader.curriculum import Curriculum, Schedule
    from wdsloader.decode import SampleDecoder, get_decoder, parse_sample, register_decoder
    from wdsloader.errors import (
        BatchValidationError,
        DecodeError,
        ManifestError,
        PickleNotAllowedError,
        SchemaError,
        ShardFormatError,
        ShardReadError,
        SkipLimitError,
        StateMismatchError,
        WdsLoaderError,
        WorkerDiedError,
    )
    from wdsloader.format import FieldSpec, Manifest, ShardInfo, SplitInfo
    from wdsloader.io import ReadOptions, ShardStore
    from wdsloader.plan import PlanConfig, Resume
    from wdsloader.stream import (
        DevicePrefetcher,
        LoaderConfig,
        LoaderState,
        ShardStreamDataset,
        WdsDataLoader,
        create_loader,
        set_epoch,
    )
    from wdsloader.validate import (
        ValidationReport,
        validate_batch,
        validate_dataset,
        validate_first_batch,
    )
