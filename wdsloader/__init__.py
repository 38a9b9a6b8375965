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
    "CollatorRegistry": "wdsloader.collate",
    "TaskSpec": "wdsloader.collate",
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
    "StorageSetupError": "wdsloader.errors",
    "WdsLoaderError": "wdsloader.errors",
    "WorkerDiedError": "wdsloader.errors",
    "EpochLengthPolicy": "wdsloader.mix",
    "MultiDataLoader": "wdsloader.mix",
    "MultiDataLoaderConfig": "wdsloader.mix",
    "SamplingStrategy": "wdsloader.mix",
    "Source": "wdsloader.mix",
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
    "DataLoaderConfig": "wdsloader.training",
    "DataLoaderFactory": "wdsloader.training",
    "create_optimized_dataloader": "wdsloader.training",
    "seed_worker": "wdsloader.training",
    "Batch": "wdsloader.training",
    "ProfileResult": "wdsloader.training",
    "get_epoch_length": "wdsloader.training",
    "get_train_dataloader_steps": "wdsloader.training",
    "get_val_dataloader_steps": "wdsloader.training",
    "profile_dataloader": "wdsloader.training",
    "create_dataloaders": "wdsloader.training",
    "DataModuleProtocol": "wdsloader.training",
    "UniversalDataModule": "wdsloader.training",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.collate import CollatorRegistry, TaskSpec
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
        StorageSetupError,
        WdsLoaderError,
        WorkerDiedError,
    )
    from wdsloader.format import FieldSpec, Manifest, ShardInfo, SplitInfo
    from wdsloader.io import ReadOptions, ShardStore
    from wdsloader.mix import (
        EpochLengthPolicy,
        MultiDataLoader,
        MultiDataLoaderConfig,
        SamplingStrategy,
        Source,
    )
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
    from wdsloader.training import (
        Batch,
        DataLoaderConfig,
        DataLoaderFactory,
        DataModuleProtocol,
        ProfileResult,
        UniversalDataModule,
        create_dataloaders,
        create_optimized_dataloader,
        get_epoch_length,
        get_train_dataloader_steps,
        get_val_dataloader_steps,
        profile_dataloader,
        seed_worker,
    )
    from wdsloader.validate import (
        ValidationReport,
        validate_batch,
        validate_dataset,
        validate_first_batch,
    )
