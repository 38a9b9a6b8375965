"""``DataLoaderConfig``: the options of a loader the factory makes, with their automatic values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DataLoaderConfig"]


@dataclass(slots=True)
class DataLoaderConfig:
    """How :class:`~wdsloader.training.DataLoaderFactory` builds a loader (the fields of the
    training-engine data API).

    ``pin_memory=None`` means "CUDA is available"; ``persistent_workers=None`` means
    ``num_workers > 0``; ``prefetch_factor`` and ``persistent_workers`` apply only with workers.
    ``collate_fn`` is a callable or a registered collator's name (it wins over a task spec's
    collator). ``distributed=True`` shards a map-style dataset over ranks with a
    ``DistributedSampler`` seeded by ``seed``; ``world_size``/``rank`` default to
    ``torch.distributed``'s (which must then be initialised) and need ``distributed=True``.
    """

    batch_size: int = 32
    shuffle: bool = True
    num_workers: int = 2
    pin_memory: bool | None = None
    prefetch_factor: int | None = 2
    persistent_workers: bool | None = None
    drop_last: bool = False
    seed: int = 42
    collate_fn: Callable[[list[Any]], Any] | str | None = None
    distributed: bool = False
    world_size: int | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not _is_int(self.num_workers) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.prefetch_factor is not None and (
            not _is_int(self.prefetch_factor) or self.prefetch_factor < 1
        ):
            raise ValueError(
                f"prefetch_factor must be a positive integer or None, got {self.prefetch_factor!r}"
            )
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not self.distributed and (self.world_size is not None or self.rank is not None):
            raise ValueError(
                f"world_size={self.world_size!r} / rank={self.rank!r} need distributed=True"
            )
        if self.world_size is not None and (not _is_int(self.world_size) or self.world_size < 1):
            raise ValueError(f"world_size must be a positive integer, got {self.world_size!r}")
        if self.rank is not None and (not _is_int(self.rank) or self.rank < 0):
            raise ValueError(f"rank must be an integer >= 0, got {self.rank!r}")
        if self.world_size is not None and self.rank is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        if self.collate_fn is not None and not (
            callable(self.collate_fn) or isinstance(self.collate_fn, str)
        ):
            raise TypeError(
                f"collate_fn must be callable or a collator name, got {self.collate_fn!r}"
            )

    def resolved_pin_memory(self) -> bool:
        """``pin_memory``, with None resolved to "CUDA is available"."""
        if self.pin_memory is not None:
            return bool(self.pin_memory)
        import torch

        return torch.cuda.is_available()

    def worker_options(self) -> dict[str, Any]:
        """``persistent_workers`` and ``prefetch_factor`` as torch takes them (none without
        workers)."""
        if self.num_workers == 0:
            return {}
        persistent = self.persistent_workers
        return {
            "persistent_workers": True if persistent is None else bool(persistent),
            "prefetch_factor": self.prefetch_factor if self.prefetch_factor is not None else 2,
        }

    def rank_and_world(self) -> tuple[int, int]:
        """``(rank, world_size)``: ``(0, 1)`` unless distributed; missing values from
        ``torch.distributed``."""
        if not self.distributed:
            return 0, 1
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed=True without rank and world_size needs an initialised "
                "torch.distributed process group (or pass rank= and world_size=)"
            )
        rank = self.rank if self.rank is not None else dist.get_rank()
        world = self.world_size if self.world_size is not None else dist.get_world_size()
        if rank >= world:
            raise ValueError(f"rank {rank} is not below world_size {world}")
        return rank, world


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
