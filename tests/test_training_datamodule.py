"""UniversalDataModule / DataModuleProtocol (seed 001): the accepted data, the seeded disjoint
validation split, shard datasets' own splits, missing loaders, errors, and a Lightning Trainer."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from tests.dataset_factory import write_dataset
from wdsloader import WdsDataLoader
from wdsloader.training import DataModuleProtocol, UniversalDataModule


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "x": torch.tensor([float(i)])}


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(4)


def ids(loader) -> list[int]:
    return [int(i) for b in loader for i in b["i"]]


def test_protocol_is_runtime_checkable():
    class Duck:
        def train_dataloader(self):
            return []

        def val_dataloader(self):
            return None

    assert isinstance(UniversalDataModule(Numbers(10), num_workers=0), DataModuleProtocol)
    assert isinstance(Duck(), DataModuleProtocol)
    assert not isinstance(object(), DataModuleProtocol)


def test_val_split_is_seeded_disjoint_and_reproducible():
    dm = UniversalDataModule(Numbers(50), batch_size=8, val_split=0.2, num_workers=0, seed=3)
    train, val = ids(dm.train_dataloader()), ids(dm.val_dataloader())
    assert len(val) == 10 and len(train) == 40
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(range(50))
    assert val == sorted(val)  # validation in order
    assert train != sorted(train)  # training shuffled
    same = UniversalDataModule(Numbers(50), batch_size=8, num_workers=0, seed=3)
    assert ids(same.val_dataloader()) == val and ids(same.train_dataloader()) == train
    other = UniversalDataModule(Numbers(50), batch_size=8, num_workers=0, seed=4)
    assert ids(other.val_dataloader()) != val
    assert dm.test_dataloader() is None


def test_list_of_tensors_and_no_validation():
    data = [torch.full((3,), i) for i in range(20)]
    dm = UniversalDataModule(data, batch_size=4, val_split=0.25, num_workers=0)
    train = [int(r[0]) for (b,) in dm.train_dataloader() for r in b]
    val = [int(r[0]) for (b,) in dm.val_dataloader() for r in b]
    assert len(val) == 5 and sorted(train + val) == list(range(20))
    none = UniversalDataModule(data, batch_size=4, val_split=0.0, num_workers=0)
    assert none.val_dataloader() is None
    assert len(none.train_dataloader()) == 5


def test_hf_dataset_and_datasetdict():
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"i": list(range(30))})
    dm = UniversalDataModule(hf, batch_size=4, val_split=0.2, num_workers=0, seed=1)
    train, val = ids(dm.train_dataloader()), ids(dm.val_dataloader())
    assert len(val) == 6 and set(train).isdisjoint(val) and len(train) == 24
    again = UniversalDataModule(hf, batch_size=4, val_split=0.2, num_workers=0, seed=1)
    assert sorted(ids(again.val_dataloader())) == sorted(val)
    dd = datasets.DatasetDict(
        train=hf,
        validation=datasets.Dataset.from_dict({"i": [100, 101, 102]}),
        test=datasets.Dataset.from_dict({"i": [200]}),
    )
    dm = UniversalDataModule(dd, batch_size=2, num_workers=0)
    assert sorted(ids(dm.train_dataloader())) == list(range(30))  # val_split unused
    assert ids(dm.val_dataloader()) == [100, 101, 102]
    assert ids(dm.test_dataloader()) == [200]


def test_external_val_data_wins():
    dm = UniversalDataModule(Numbers(12), val_data=Numbers(3), batch_size=4, num_workers=0)
    assert sorted(ids(dm.train_dataloader())) == list(range(12))
    assert ids(dm.val_dataloader()) == [0, 1, 2]


def test_shard_dataset_uses_its_own_splits(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, {"train": [12, 9], "val": [5], "test": [3]})
    dm = UniversalDataModule(root, batch_size=4, num_workers=0, seed=5)
    train = dm.train_dataloader()
    assert isinstance(train, WdsDataLoader) and train.dataset_obj.split == "train"
    assert sorted(int(i) for b in train for i in b["idx"]) == list(range(21))
    assert [b["idx"].tolist() for b in dm.val_dataloader()] == [[0, 1, 2, 3], [4]]
    assert [b["idx"].tolist() for b in dm.test_dataloader()] == [[0, 1, 2]]
    only_train = str(tmp_path / "t")
    write_dataset(only_train, {"train": [6]})
    dm = UniversalDataModule(only_train, num_workers=0)
    assert dm.val_dataloader() is None and dm.test_dataloader() is None


def test_errors(tmp_path):
    with pytest.raises(ValueError, match=r"val_split must be in \[0, 1\)"):
        UniversalDataModule(Numbers(4), val_split=1.0)
    with pytest.raises(ValueError, match="leaves no training sample"):
        UniversalDataModule(Numbers(1), val_split=0.5)
    with pytest.raises(ValueError, match="an iterable dataset cannot be split"):
        UniversalDataModule(Stream())
    with pytest.raises(ValueError, match="brings its own splits"):
        UniversalDataModule(str(tmp_path), val_data=Numbers(2))
    write_dataset(str(tmp_path / "v"), {"val": [3]})
    with pytest.raises(ValueError, match=r"has no 'train' split \(splits: \['val'\]\)"):
        UniversalDataModule(str(tmp_path / "v")).train_dataloader()


def test_lightning_trainer_fits_it():
    lightning = pytest.importorskip("lightning")

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []

        def training_step(self, batch, _):
            self.seen += batch["i"].tolist()
            return (self.layer(batch["x"]) - 2 * batch["x"]).pow(2).mean()

        def validation_step(self, batch, _):
            self.log("val_loss", (self.layer(batch["x"]) - 2 * batch["x"]).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    dm = UniversalDataModule(Numbers(20), batch_size=4, num_workers=0, seed=2)
    model = Model()
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm.to_lightning())
    assert sorted(model.seen) == sorted(ids(dm.train_dataloader()))
    assert len(model.seen) == 16 and "val_loss" in trainer.callback_metrics
