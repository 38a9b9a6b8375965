"""The factory and the data module take a list of MixSource like create_loader does: a mix of built
datasets with exact per-epoch quotas, and the splits every source has."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.dataset_factory import write_dataset
from wdsloader import DataLoaderConfig, DataLoaderFactory, UniversalDataModule
from wdsloader.mix import MixSource


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trainmix")
    write_dataset(str(root / "a"), {"train": [60], "val": [10]})
    write_dataset(str(root / "b"), {"train": [30], "val": [6], "test": [5]})
    return root


def _sources(data: Path) -> list[MixSource]:
    return [MixSource(data / "a", weight=0.75), MixSource(data / "b", weight=0.25)]


def _per_source(loader) -> Counter:
    counts: Counter = Counter()
    for batch in loader:
        counts.update(batch["__source__"].tolist())
    return counts


def test_factory_mixes_sources_with_exact_quotas(data):
    config = DataLoaderConfig(batch_size=10, num_workers=0, seed=3)
    loader = DataLoaderFactory().create_dataloader(
        _sources(data), config, split="train", source_field="__source__", epoch_samples=80
    )
    assert _per_source(loader) == {0: 60, 1: 20}  # 0.75 / 0.25 of 80


def test_data_module_uses_the_splits_every_source_has(data):
    dm = UniversalDataModule(_sources(data), batch_size=8, num_workers=0, seed=3)
    assert dm.test_dataloader() is None  # only b has a test split
    train = _per_source_total(dm.train_dataloader())
    val = _per_source_total(dm.val_dataloader())
    assert train == 90 and val == 16  # weighted sources: their sizes summed per epoch


def _per_source_total(loader) -> int:
    return sum(len(batch["__key__"]) for batch in loader)
