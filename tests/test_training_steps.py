"""Step accounting (seed 004): hand-computed cases on plain torch loaders and ours, each error."""

from __future__ import annotations

import logging

import pytest
from torch.utils.data import DataLoader, IterableDataset

from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.training import (
    Batch,
    get_epoch_length,
    get_train_dataloader_steps,
    get_val_dataloader_steps,
)


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(10)


@pytest.fixture()
def loader():
    return DataLoader(list(range(100)), batch_size=8)  # 13 batches, the last of 4


def test_batch_is_a_dict_alias():
    assert Batch.__origin__ is dict and Batch.__args__[0] is str


def test_epoch_length(loader):
    assert get_epoch_length(loader) == 13
    assert get_epoch_length(loader, 5) == 5
    with pytest.raises(ValueError, match=r"has no __len__ .*pass the steps per epoch"):
        get_epoch_length(DataLoader(Stream(), batch_size=4))
    with pytest.raises(ValueError, match=r"train_steps_per_epoch must be a positive integer"):
        get_epoch_length(loader, 0)
    with pytest.raises(ValueError, match=r"yields no batch in an epoch"):
        get_epoch_length(DataLoader([], batch_size=2))


def test_train_steps_hand_computed(loader, caplog):
    assert get_train_dataloader_steps(loader) == (8, 13, 1)
    assert get_train_dataloader_steps(loader, train_batch_size=32, dp_size=2) == (32, 13, 2)
    # 4 optimizer steps of 2 accumulated batches = 8 loader batches
    assert get_train_dataloader_steps(loader, 4, 32, dp_size=2) == (32, 8, 2)
    assert get_train_dataloader_steps(loader, 3, 24) == (24, 9, 3)
    with caplog.at_level(logging.WARNING, logger="wdsloader.training.steps"):
        assert get_train_dataloader_steps(loader, 10, 32, dp_size=2) == (32, 20, 2)
    assert "= 20 is more than the 13 batches" in caplog.text
    iterable = DataLoader(Stream(), batch_size=4)
    assert get_train_dataloader_steps(iterable, 7, 8) == (8, 14, 2)


def test_train_steps_errors(loader):
    with pytest.raises(ValueError, match=r"train_batch_size=4 is smaller than one step.*= 8"):
        get_train_dataloader_steps(loader, train_batch_size=4)
    with pytest.raises(ValueError, match=r"train_batch_size=24 is not a multiple.*8 x dp_size 2"):
        get_train_dataloader_steps(loader, train_batch_size=24, dp_size=2)
    with pytest.raises(ValueError, match=r"dp_size must be a positive integer"):
        get_train_dataloader_steps(loader, dp_size=0)
    with pytest.raises(ValueError, match=r"pass the steps per epoch \(train_steps_per_epoch"):
        get_train_dataloader_steps(DataLoader(Stream(), batch_size=4))
    no_size = DataLoader(list(range(6)), batch_size=None)
    with pytest.raises(ValueError, match=r"cannot tell the batch size of DataLoader"):
        get_train_dataloader_steps(no_size)


def test_val_steps_hand_computed(loader, caplog):
    assert get_val_dataloader_steps(loader) == (13, 0)
    assert get_val_dataloader_steps(loader, num_sanity_val_steps=3, dp_size=2) == (6, 1)
    with caplog.at_level(logging.WARNING, logger="wdsloader.training.steps"):
        assert get_val_dataloader_steps(loader, 20, 2, dp_size=2) == (10, 1)
    assert "val_steps_per_epoch = 20 is more than the 13 batches" in caplog.text
    with pytest.raises(ValueError, match=r"pass the steps per epoch \(val_steps_per_epoch"):
        get_val_dataloader_steps(DataLoader(Stream(), batch_size=2))
    with pytest.raises(ValueError, match=r"num_sanity_val_steps must be >= 0"):
        get_val_dataloader_steps(loader, num_sanity_val_steps=-1)


def test_our_loader_batch_size_comes_from_its_plan(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, {"train": [20, 17, 23], "val": [9]})
    ours = create_loader(root, "train", 8, rank=0, world_size=2)
    assert ours.batch_size is None and len(ours) == 3  # 60 samples // (8 x 2 ranks)
    assert get_train_dataloader_steps(ours, train_batch_size=32, dp_size=2) == (32, 3, 2)
    val = create_loader(root, "val", 4)
    assert get_val_dataloader_steps(val, num_sanity_val_steps=2) == (3, 2)
