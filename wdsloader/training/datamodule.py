"""The training-engine data modules: ``DataModuleProtocol`` and ``UniversalDataModule``.

``UniversalDataModule`` takes a built shard dataset (its own splits), a Hugging Face ``Dataset``
or ``DatasetDict``, a torch dataset, or a list of tensors/dicts, holds out a seeded validation
part when no validation data is given, and makes its loaders with
:class:`~wdsloader.training.DataLoaderFactory` (the collator picked by ``task_spec``).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import Subset

from wdsloader.training.config import DataLoaderConfig
from wdsloader.training.factory import DataLoaderFactory
from wdsloader.training.inputs import as_torch_dataset, is_hf_dataset, is_iterable, is_shard_dataset

__all__ = ["DataModuleProtocol", "UniversalDataModule", "split_indices"]

VAL_SPLIT_NAMES = ("val", "validation", "valid")


@runtime_checkable
class DataModuleProtocol(Protocol):
    """Anything with ``train_dataloader()`` and ``val_dataloader()`` (None: no validation)."""

    def train_dataloader(self) -> Any: ...

    def val_dataloader(self) -> Any | None: ...


def split_indices(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, val)`` sample indices: ``ceil(n * fraction)`` drawn for validation by a
    permutation seeded with ``seed``; both parts sorted, disjoint, covering ``range(n)``."""
    n_val = math.ceil(n * fraction)
    if n_val >= n:
        raise ValueError(
            f"val_split={fraction} of {n} samples leaves no training sample; lower val_split"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[n_val:]), sorted(order[:n_val])


class UniversalDataModule:
    """Train/val(/test) loaders from one piece of data (the training-engine data module).

    ``train_data``: the path or URL of a built shard dataset (its ``train`` split, its
    ``val``/``validation`` split and ``test`` split are used; ``val_split`` is ignored), a
    Hugging Face ``DatasetDict`` (``train``, ``validation``/``val``, ``test``) or ``Dataset``,
    a torch map-style dataset, or a list of tensors or dicts. Without ``val_data`` (and no
    validation split of its own), ``val_split`` of the samples are held out: drawn by
    ``seed``, disjoint from the training part, the same on every run. ``val_split=0`` means no
    validation. An iterable dataset cannot be split: give ``val_data`` or ``val_split=0``.

    Loaders come from ``DataLoaderFactory(collator_registry)`` with the collator of
    ``task_spec`` (and ``tokenizer``): training shuffled by ``seed``, validation and test in
    order, nothing dropped. Each call makes a new loader.
    """

    def __init__(
        self,
        train_data: Any,
        val_data: Any = None,
        task_spec: Any = None,
        tokenizer: Any = None,
        batch_size: int = 32,
        val_split: float = 0.2,
        num_workers: int = 2,
        seed: int = 42,
        collator_registry: Any = None,
        *,
        test_data: Any = None,
    ) -> None:
        if not 0 <= val_split < 1:
            raise ValueError(f"val_split must be in [0, 1), got {val_split!r}")
        self.task_spec = task_spec
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.val_split = val_split
        self.num_workers = num_workers
        self.seed = seed
        self.factory = DataLoaderFactory(collator_registry)
        self._shards: Any = None  # a path/URL, or a list of MixSource
        self._shard_splits: list[str] | None = None
        self.train_data: Any = None
        self.val_data: Any = None
        self.test_data: Any = test_data
        if is_shard_dataset(train_data):
            if val_data is not None or test_data is not None:
                raise ValueError(
                    "a built shard dataset brings its own splits: val_data/test_data would be "
                    "unused"
                )
            self._shards = train_data if isinstance(train_data, list | tuple) else str(train_data)
        else:
            self._init_memory(train_data, val_data)

    def _init_memory(self, train_data: Any, val_data: Any) -> None:
        if is_hf_dataset(train_data, "DatasetDict"):
            if "train" not in train_data:
                raise ValueError(
                    f"the DatasetDict has no 'train' split (splits: {sorted(train_data)})"
                )
            own_val = next((train_data[s] for s in VAL_SPLIT_NAMES if s in train_data), None)
            if self.test_data is None and "test" in train_data:
                self.test_data = train_data["test"]
            if val_data is None:
                val_data = own_val
            train_data = train_data["train"]
        if val_data is not None or self.val_split == 0:
            self.train_data, self.val_data = train_data, val_data
            return
        if is_hf_dataset(train_data):
            parts = train_data.train_test_split(test_size=self.val_split, seed=self.seed)
            self.train_data, self.val_data = parts["train"], parts["test"]
            return
        data = as_torch_dataset(train_data)
        if is_iterable(data):
            raise ValueError(
                "an iterable dataset cannot be split for validation: pass val_data= or val_split=0"
            )
        train_idx, val_idx = split_indices(len(data), self.val_split, self.seed)
        self.train_data, self.val_data = Subset(data, train_idx), Subset(data, val_idx)

    # -- shard datasets ------------------------------------------------------------------------
    def _splits(self) -> list[str]:
        if self._shard_splits is None:
            from wdsloader.io.manifest_io import load_manifest

            assert self._shards is not None
            if isinstance(self._shards, list | tuple):  # a mix: the splits every source has
                found = [list(load_manifest(source.url).splits) for source in self._shards]
                self._shard_splits = [s for s in found[0] if all(s in f for f in found[1:])]
            else:
                self._shard_splits = list(load_manifest(self._shards).splits)
        return self._shard_splits

    def _shard_split(self, kind: str) -> str | None:
        names = ("train",) if kind == "train" else VAL_SPLIT_NAMES if kind == "val" else ("test",)
        return next((s for s in names if s in self._splits()), None)

    # -- loaders -------------------------------------------------------------------------------
    def _config(self, train: bool) -> DataLoaderConfig:
        return DataLoaderConfig(
            batch_size=self.batch_size,
            shuffle=train,
            num_workers=self.num_workers,
            drop_last=False,
            seed=self.seed,
        )

    def _loader(self, kind: str) -> Any:
        train = kind == "train"
        if self._shards is not None:
            split = self._shard_split(kind)
            if split is None:
                if train:
                    raise ValueError(
                        f"{self._shards} has no 'train' split (splits: {self._splits()})"
                    )
                return None
            return self.factory.create_dataloader(
                self._shards, self._config(train), self.task_spec, self.tokenizer, split=split
            )
        data = {"train": self.train_data, "val": self.val_data, "test": self.test_data}[kind]
        if data is None:
            return None
        return self.factory.create_dataloader(
            data, self._config(train), self.task_spec, self.tokenizer
        )

    def train_dataloader(self) -> Any:
        """The training loader (shuffled by ``seed``; ``set_epoch`` moves it on)."""
        return self._loader("train")

    def val_dataloader(self) -> Any | None:
        """The validation loader, in order; None without validation data."""
        return self._loader("val")

    def test_dataloader(self) -> Any | None:
        """The test loader, in order; None without a test split."""
        return self._loader("test")

    def to_lightning(self) -> Any:
        """This module as a ``lightning.LightningDataModule`` (for ``Trainer.fit(model,
        datamodule=...)``; needs ``lightning``)."""
        from wdsloader.training.lightning import as_lightning_datamodule

        return as_lightning_datamodule(self)
