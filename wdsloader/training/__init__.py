"""What training code imports: the loader factory and its config, worker seeding, data modules,
language-model text loaders, step accounting and loader profiling (the names seeds 001-004
document)."""

from wdsloader.training.config import DataLoaderConfig
from wdsloader.training.factory import (
    DataLoaderFactory,
    EpochShuffleSampler,
    SeededDataLoader,
    create_optimized_dataloader,
)
from wdsloader.training.seeding import WorkerSeeder, seed_worker, worker_seed

__all__ = [
    "DataLoaderConfig",
    "DataLoaderFactory",
    "EpochShuffleSampler",
    "SeededDataLoader",
    "WorkerSeeder",
    "create_optimized_dataloader",
    "seed_worker",
    "worker_seed",
]
