"""The training-engine loader factory: one seeded loader from any data and a config.

``DataLoaderFactory().create_dataloader(data, config)`` takes a torch map-style or iterable
dataset, a Hugging Face ``Dataset``, a list of tensors or dicts (see
:func:`~wdsloader.training.inputs.as_torch_dataset`), or the path/URL of a built shard dataset
plus a split (then :func:`wdsloader.create_loader` with the same options). Every loader it
makes is seeded (the same config gives the same batches, with or without workers), seeds each
worker from ``(seed, epoch, rank, worker)`` and has ``set_epoch``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from wdsloader.training.config import DataLoaderConfig
from wdsloader.training.inputs import as_torch_dataset, is_iterable, is_shard_dataset
from wdsloader.training.seeding import WorkerSeeder, epoch_generator

if TYPE_CHECKING:
    from wdsloader.stream.loader import WdsDataLoader

log = logging.getLogger(__name__)

__all__ = [
    "DataLoaderFactory",
    "EpochShuffleSampler",
    "SeededDataLoader",
    "create_optimized_dataloader",
]


class EpochShuffleSampler(Sampler[int]):
    """A permutation of ``range(num_samples)`` drawn from ``(seed, epoch)``: the same for the
    same pair, another after :meth:`set_epoch`."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.num_samples, generator=epoch_generator(self.seed, self.epoch))
        return iter(order.tolist())


class SeededDataLoader(DataLoader):
    """A torch DataLoader with an epoch: ``set_epoch(e)`` sets the sampler's epoch (shuffle
    order), the worker seeds and, when it has one, the dataset's ``set_epoch``; iterating to the
    end moves to the next epoch (as :class:`~wdsloader.WdsDataLoader` does). ``worker_seeder``
    is its ``worker_init_fn`` (:class:`~wdsloader.training.WorkerSeeder`)."""

    def __init__(self, dataset: Any, *, seed: int, rank: int = 0, **kwargs: Any) -> None:
        self.worker_seeder = WorkerSeeder(seed, rank, 0)
        self.seed = seed
        self._epoch = 0
        super().__init__(
            dataset,
            worker_init_fn=self.worker_seeder,
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration plays."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` next: shuffle order, worker seeds, and the dataset's own
        ``set_epoch`` if it has one."""
        self._epoch = int(epoch)
        self.worker_seeder.epoch = self._epoch
        sampler = getattr(self.batch_sampler, "sampler", self.sampler)
        for target in (sampler, self.dataset):
            method = getattr(target, "set_epoch", None)
            if callable(method):
                method(self._epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        yield from super().__iter__()
        self.set_epoch(self._epoch + 1)


class DataLoaderFactory:
    """Builds seeded loaders (the training-engine data API's factory); ``collator_registry``
    defaults to ``CollatorRegistry.get_instance()``."""

    def __init__(self, collator_registry: Any = None) -> None:
        self.collator_registry = collator_registry

    def _registry(self) -> Any:
        if self.collator_registry is None:
            from wdsloader.collate import CollatorRegistry

            self.collator_registry = CollatorRegistry.get_instance()
        return self.collator_registry

    def resolve_collate(
        self, config: DataLoaderConfig, task_spec: Any = None, tokenizer: Any = None
    ) -> Callable[[list[Any]], Any] | str | None:
        """The collate function: ``config.collate_fn`` (a name is looked up in the registry and
        its factory gets ``task_spec`` too), else the registry's pick for ``task_spec``, else
        None (torch's default collate)."""
        extra = {} if tokenizer is None else {"tokenizer": tokenizer}
        collate = config.collate_fn
        if isinstance(collate, str):
            return self._registry().get_collator(task_spec, collator_name=collate, **extra)
        if collate is not None:
            return collate
        if task_spec is not None:
            return self._registry().get_collator(task_spec=task_spec, **extra)
        if tokenizer is not None:
            raise ValueError(
                "tokenizer= is used by a collator: pass task_spec= (e.g. TaskSpec.lm_tiny()) or "
                "config.collate_fn= naming one"
            )
        return None

    def create_dataloader(
        self,
        dataset: Any,
        config: DataLoaderConfig | None = None,
        task_spec: Any = None,
        tokenizer: Any = None,
        *,
        split: str = "train",
        **shard_options: Any,
    ) -> SeededDataLoader | WdsDataLoader:
        """A loader over ``dataset`` built as ``config`` says (default ``DataLoaderConfig()``).

        For a built shard dataset (a path or URL), ``split`` picks the split and
        ``shard_options`` go to :func:`wdsloader.create_loader` (``decode``, ``read_options``,
        ``storage_options`` ...); they are a ValueError for in-memory data. ``distributed=True``
        on an iterable dataset is a ValueError (it has no sampler to shard).
        """
        config = config if config is not None else DataLoaderConfig()
        collate = self.resolve_collate(config, task_spec, tokenizer)
        if is_shard_dataset(dataset):
            if isinstance(config.collate_fn, str) and tokenizer is None and task_spec is None:
                collate = config.collate_fn  # by name: the loader's state records the name
            return _shard_loader(dataset, split, config, collate, shard_options)
        if shard_options:
            raise ValueError(f"{sorted(shard_options)} apply only to a built shard dataset")
        data = as_torch_dataset(dataset)
        rank, world = config.rank_and_world()
        sampler: Sampler[int] | None = None
        if is_iterable(data):
            if config.distributed:
                raise ValueError(
                    "distributed=True needs a map-style dataset (an iterable dataset has no "
                    "sampler: split it by rank inside the dataset)"
                )
            if config.shuffle:
                log.warning("shuffle=True is ignored for an iterable dataset (it has no sampler)")
        elif config.distributed:
            sampler = DistributedSampler(
                data,
                num_replicas=world,
                rank=rank,
                shuffle=config.shuffle,
                seed=config.seed,
                drop_last=config.drop_last,
            )
        elif config.shuffle:
            sampler = EpochShuffleSampler(len(data), config.seed)
        return SeededDataLoader(
            data,
            seed=config.seed,
            rank=rank,
            batch_size=config.batch_size,
            sampler=sampler,
            num_workers=config.num_workers,
            collate_fn=collate if callable(collate) else None,
            pin_memory=config.resolved_pin_memory(),
            drop_last=config.drop_last,
            **config.worker_options(),
        )


def _shard_loader(
    root: Any,
    split: str,
    config: DataLoaderConfig,
    collate: Callable[[list[Any]], Any] | str | None,
    options: dict[str, Any],
) -> WdsDataLoader:
    from wdsloader.stream.loader import create_loader
    from wdsloader.stream.options import Topology, WorkerOptions

    given: dict[str, Any] = {}
    if config.distributed:
        if config.rank is None and config.world_size is None:
            given["distributed"] = True
        else:
            rank, world = config.rank_and_world()
            given["topology"] = Topology(rank=rank, world_size=world)
    if config.num_workers > 0:
        given["workers"] = WorkerOptions(**config.worker_options())
    clash = sorted(set(given) & set(options))
    if clash:
        raise ValueError(
            f"{clash} would contradict the DataLoaderConfig, which gives them "
            "(set num_workers, prefetch_factor, persistent_workers, distributed, rank and "
            "world_size there)"
        )
    loader = create_loader(
        root,
        split,
        config.batch_size,
        num_workers=config.num_workers,
        seed=config.seed,
        shuffle=config.shuffle,
        drop_last=config.drop_last,
        pin_memory=config.resolved_pin_memory(),
        collate_fn=collate,
        **given,
        **options,
    )
    # the plan's epoch is the dataset's; each worker pool seeds itself from it
    loader.worker_init_fn = WorkerSeeder(config.seed, loader.dataset_obj.rank, None)
    return loader


def create_optimized_dataloader(
    dataset: Any,
    batch_size: int,
    is_training: bool = True,
    num_workers: int = 4,
    world_size: int = 1,
    rank: int = 0,
    seed: int = 42,
) -> SeededDataLoader | WdsDataLoader:
    """The best-practice DataLoader recipe: shuffled and ``drop_last`` for training, a seeded
    ``DistributedSampler`` when ``world_size > 1``, pinned memory with CUDA, persistent
    workers and ``prefetch_factor=2`` with workers, each worker seeded."""
    distributed = world_size > 1
    config = DataLoaderConfig(
        batch_size=batch_size,
        shuffle=is_training,
        num_workers=num_workers,
        drop_last=is_training,
        seed=seed,
        distributed=distributed,
        world_size=world_size if distributed else None,
        rank=rank if distributed else None,
    )
    return DataLoaderFactory().create_dataloader(dataset, config)
