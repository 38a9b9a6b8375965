"""What training code imports: the loader factory and its config, worker seeding, data modules,
language-model text loaders, step accounting and loader profiling (the names that users of other
training codebases know: a collator registry and loader factory, DataLoader best-practice helpers,
MicroTransformer's ``create_dataloaders`` and Dream Trainer's step accounting). Names are
imported on first use (torch, and ``build_shards`` for the text loaders).
The Lightning adapter (``wdsloader.training.lightning``, needs ``lightning``) is not
re-exported: ``UniversalDataModule.to_lightning()`` loads it."""

# ruff: noqa: F401 - the TYPE_CHECKING imports name what __all__ (from _EXPORTS) lists
from __future__ import annotations

from typing import TYPE_CHECKING

from wdsloader.lazy import lazy_exports

_EXPORTS = {
    "DataLoaderConfig": "wdsloader.training.config",
    "DataLoaderFactory": "wdsloader.training.factory",
    "EpochShuffleSampler": "wdsloader.training.factory",
    "SeededDataLoader": "wdsloader.training.factory",
    "create_optimized_dataloader": "wdsloader.training.factory",
    "DataModuleProtocol": "wdsloader.training.datamodule",
    "UniversalDataModule": "wdsloader.training.datamodule",
    "ProfileResult": "wdsloader.training.profile",
    "profile_dataloader": "wdsloader.training.profile",
    "WorkerSeeder": "wdsloader.training.seeding",
    "seed_worker": "wdsloader.training.seeding",
    "worker_seed": "wdsloader.training.seeding",
    "create_dataloaders": "wdsloader.training.text",
    "Batch": "wdsloader.training.steps",
    "get_epoch_length": "wdsloader.training.steps",
    "get_train_dataloader_steps": "wdsloader.training.steps",
    "get_val_dataloader_steps": "wdsloader.training.steps",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.training.config import DataLoaderConfig
    from wdsloader.training.datamodule import DataModuleProtocol, UniversalDataModule
    from wdsloader.training.factory import (
        DataLoaderFactory,
        EpochShuffleSampler,
        SeededDataLoader,
        create_optimized_dataloader,
    )
    from wdsloader.training.profile import ProfileResult, profile_dataloader
    from wdsloader.training.seeding import WorkerSeeder, seed_worker, worker_seed
    from wdsloader.training.steps import (
        Batch,
        get_epoch_length,
        get_train_dataloader_steps,
        get_val_dataloader_steps,
    )
    from wdsloader.training.text import create_dataloaders
