"""wdsloader: stream WebDataset shards into PyTorch with exact DDP splitting and exact resume.

The read side of the project; :mod:`wdsloader.format` is the on-disk contract that
``build_shards`` writes. Names are imported on first use, so ``import wdsloader`` (and the
format layer the builder uses) does not import torch.

The top level holds what training code imports: the loader, its options and state, mixing, the
training API (factory, data modules, seeding, step accounting, profiling), validation and the
error classes. The parts below it (plan, decode, format, io, stream internals) are imported from
their subpackages: ``from wdsloader.stream import ShardStreamDataset``. A name that left the top
level still resolves there until wdsloader 0.2.0, with a ``DeprecationWarning`` naming its import.
"""

# ruff: noqa: F401 - the TYPE_CHECKING imports name what __all__ (from _EXPORTS) lists
from __future__ import annotations

from typing import TYPE_CHECKING

from wdsloader.lazy import lazy_exports
from wdsloader.seams import provide as _provide

# The on-disk contract (wdsloader.format) imports no storage: Manifest.load/save read and write
# through this module, imported (and plugged in) at their first use.
_provide("manifest-storage", "wdsloader.io.manifest_io")
# The codec registry (wdsloader.format.codecs) imports the codecs that decode with Pillow or torch
# from here at its first lookup.
_provide("codecs", "wdsloader.decode.codecs")

__version__ = "0.1.0"

_EXPORTS = {
    "ShardDataset": "wdsloader.access",
    "CollatorRegistry": "wdsloader.collate",
    "TaskSpec": "wdsloader.collate",
    "Curriculum": "wdsloader.curriculum",
    "ShardReadError": "wdsloader.errors",
    "SkipLimitError": "wdsloader.errors",
    "StateMismatchError": "wdsloader.errors",
    "WdsLoaderError": "wdsloader.errors",
    "WorkerDiedError": "wdsloader.errors",
    "MultiDataLoader": "wdsloader.mix",
    "MultiDataLoaderConfig": "wdsloader.mix",
    "SamplingStrategy": "wdsloader.mix",
    "MixSource": "wdsloader.mix",
    "Mix": "wdsloader.mix",
    "ReadOptions": "wdsloader.io",
    "PlanOptions": "wdsloader.stream",
    "Packing": "wdsloader.plan",
    "Topology": "wdsloader.stream",
    "WorkerOptions": "wdsloader.stream",
    "DecodeOptions": "wdsloader.stream",
    "ErrorPolicy": "wdsloader.stream",
    "LoaderState": "wdsloader.stream",
    "WdsDataLoader": "wdsloader.stream",
    "create_loader": "wdsloader.stream",
    "set_epoch": "wdsloader.stream",
    "ValidationReport": "wdsloader.validate",
    "validate_batch": "wdsloader.validate",
    "validate_dataset": "wdsloader.validate",
    "validate_first_batch": "wdsloader.validate",
    "DataLoaderConfig": "wdsloader.training",
    "DataLoaderFactory": "wdsloader.training",
    "create_optimized_dataloader": "wdsloader.training",
    "seed_worker": "wdsloader.training",
    "Batch": "wdsloader.training",
    "get_epoch_length": "wdsloader.training",
    "get_train_dataloader_steps": "wdsloader.training",
    "get_val_dataloader_steps": "wdsloader.training",
    "profile_dataloader": "wdsloader.training",
    "create_dataloaders": "wdsloader.training",
    "DataModuleProtocol": "wdsloader.training",
    "UniversalDataModule": "wdsloader.training",
}

__all__ = sorted(_EXPORTS)

# Names that left the top level: they still resolve, with a DeprecationWarning naming the import.
_MOVED = {
    "ShardStreamDataset": ("wdsloader.stream", "ShardStreamDataset"),
    "LoaderConfig": ("wdsloader.stream", "LoaderConfig"),
    "PlanConfig": ("wdsloader.plan", "PlanConfig"),
    "Resume": ("wdsloader.plan", "Resume"),
    "ShardStore": ("wdsloader.io", "ShardStore"),
    "SampleDecoder": ("wdsloader.decode", "SampleDecoder"),
    "get_decoder": ("wdsloader.decode", "get_decoder"),
    "parse_sample": ("wdsloader.decode", "parse_sample"),
    "register_decoder": ("wdsloader.decode", "register_decoder"),
    "FieldSpec": ("wdsloader.format", "FieldSpec"),
    "Manifest": ("wdsloader.format", "Manifest"),
    "ShardInfo": ("wdsloader.format", "ShardInfo"),
    "SplitInfo": ("wdsloader.format", "SplitInfo"),
    "Schedule": ("wdsloader.curriculum", "Schedule"),
    "EpochLengthPolicy": ("wdsloader.mix", "EpochLengthPolicy"),
    "ProfileResult": ("wdsloader.training", "ProfileResult"),
    "DevicePrefetcher": ("wdsloader.stream", "DevicePrefetcher"),
    "Source": ("wdsloader", "MixSource"),  # renamed: build_shards.Source is a build input
    "DecodeError": ("wdsloader.errors", "DecodeError"),
    "ManifestError": ("wdsloader.errors", "ManifestError"),
    "PickleNotAllowedError": ("wdsloader.errors", "PickleNotAllowedError"),
    "SchemaError": ("wdsloader.errors", "SchemaError"),
    "ShardFormatError": ("wdsloader.errors", "ShardFormatError"),
    "StorageSetupError": ("wdsloader.errors", "StorageSetupError"),
    "BatchValidationError": ("wdsloader.errors", "BatchValidationError"),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _MOVED)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.collate import CollatorRegistry, TaskSpec
    from wdsloader.curriculum import Curriculum
    from wdsloader.errors import (
        ShardReadError,
        SkipLimitError,
        StateMismatchError,
        WdsLoaderError,
        WorkerDiedError,
    )
    from wdsloader.io import ReadOptions
    from wdsloader.mix import (
        Mix,
        MixSource,
        MultiDataLoader,
        MultiDataLoaderConfig,
        SamplingStrategy,
    )
    from wdsloader.plan import Packing
    from wdsloader.stream import (
        DecodeOptions,
        ErrorPolicy,
        LoaderState,
        PlanOptions,
        Topology,
        WdsDataLoader,
        WorkerOptions,
        create_loader,
        set_epoch,
    )
    from wdsloader.training import (
        Batch,
        DataLoaderConfig,
        DataLoaderFactory,
        DataModuleProtocol,
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
