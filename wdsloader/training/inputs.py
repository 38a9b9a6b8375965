"""In-memory data the loader factory accepts, turned into something a torch DataLoader reads."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

__all__ = ["SampleList", "as_torch_dataset", "is_hf_dataset", "is_iterable", "is_shard_dataset"]


class SampleList(Dataset):
    """A map-style dataset over a list of samples (e.g. dicts)."""

    def __init__(self, samples: Sequence[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]


def is_shard_dataset(data: Any) -> bool:
    """True for a path or URL (a dataset built by ``build_shards``), or a non-empty list of
    :class:`~wdsloader.mix.MixSource` (built datasets mixed by ``create_loader``)."""
    if isinstance(data, str | os.PathLike):
        return True
    if isinstance(data, list | tuple) and data:
        from wdsloader.mix.source import MixSource

        return all(isinstance(item, MixSource) for item in data)
    return False


def is_hf_dataset(data: Any, kind: str = "Dataset") -> bool:
    """True when ``data`` is a Hugging Face ``datasets.<kind>`` (never imports ``datasets``)."""
    module = sys.modules.get("datasets")
    cls = getattr(module, kind, None) if module is not None else None
    return cls is not None and isinstance(data, cls)


def is_iterable(data: Any) -> bool:
    """True for a dataset that is iterated rather than indexed (no sampler applies)."""
    return isinstance(data, IterableDataset) or is_hf_dataset(data, "IterableDataset")


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    first = tensors[0].shape
    for i, t in enumerate(tensors):
        if t.shape != first:
            raise ValueError(
                f"a list of tensors becomes a TensorDataset, which needs one shape: item 0 has "
                f"shape {tuple(first)}, item {i} has {tuple(t.shape)}"
            )
    return torch.stack(list(tensors))


def as_torch_dataset(data: Any) -> Any:
    """``data`` as a dataset a torch DataLoader reads.

    A torch map-style or iterable dataset and a Hugging Face ``Dataset``/``IterableDataset`` are
    used as they are; a list of tensors becomes a ``TensorDataset`` (items ``(tensor,)``); a
    list of dicts a :class:`SampleList`. Anything else is a TypeError.
    """
    if isinstance(data, Dataset | IterableDataset) or is_hf_dataset(data) or is_iterable(data):
        return data
    if is_hf_dataset(data, "DatasetDict"):
        raise TypeError(
            f"a DatasetDict holds several splits ({sorted(data)}); pass one of them, "
            f"or use UniversalDataModule"
        )
    if isinstance(data, list | tuple):
        if not data:
            raise ValueError("the list of samples is empty")
        if all(isinstance(x, torch.Tensor) for x in data):
            return TensorDataset(_stack(data))
        if all(isinstance(x, Mapping) for x in data):
            return SampleList(data)
        kinds = sorted({type(x).__name__ for x in data})
        raise TypeError(f"a list of samples must hold only tensors or only dicts, got {kinds}")
    raise TypeError(
        f"cannot load {type(data).__name__}: pass a torch Dataset or IterableDataset, a Hugging "
        f"Face Dataset, a list of tensors or dicts, or the path/URL of a built shard dataset"
    )
