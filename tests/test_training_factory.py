"""DataLoaderFactory / DataLoaderConfig / create_optimized_dataloader / seed_worker (seeds 001,
002): seeded batches with and without workers, per-worker random streams, distributed sampling,
set_epoch on every loader the factory makes, the accepted inputs and each error."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from tests.dataset_factory import write_dataset
from wdsloader import WdsDataLoader, create_loader, set_epoch
from wdsloader.training import (
    DataLoaderConfig,
    DataLoaderFactory,
    SeededDataLoader,
    create_optimized_dataloader,
    seed_worker,
    worker_seed,
)


class RandomDraws(Dataset):
    """Each item: its index, the worker that made it, and one draw of random/numpy/torch."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        info = torch.utils.data.get_worker_info()
        return {
            "i": i,
            "worker": -1 if info is None else info.id,
            "py": random.random(),
            "np": float(np.random.rand()),
            "torch": float(torch.rand(())),
        }


class Count(IterableDataset):
    def __iter__(self):
        yield from range(10)


def tensors(n: int = 50) -> list[torch.Tensor]:
    return [torch.tensor([i, 2 * i]) for i in range(n)]


def batches(loader) -> list[list[int]]:
    return [b[0][:, 0].tolist() for b in loader]


def test_same_config_same_batches_with_zero_and_two_workers():
    factory = DataLoaderFactory()
    data = tensors()
    config0 = DataLoaderConfig(batch_size=8, num_workers=0, seed=7)
    config2 = DataLoaderConfig(batch_size=8, num_workers=2, seed=7)
    first = batches(factory.create_dataloader(data, config0))
    assert sorted(i for b in first for i in b) == list(range(50))
    assert first != [list(range(i, min(i + 8, 50))) for i in range(0, 50, 8)]  # shuffled
    assert batches(factory.create_dataloader(data, config0)) == first
    assert batches(factory.create_dataloader(data, config2)) == first
    other = batches(factory.create_dataloader(data, DataLoaderConfig(batch_size=8, seed=8)))
    assert other != first


def test_epochs_advance_and_set_epoch_replays():
    loader = DataLoaderFactory().create_dataloader(tensors(), DataLoaderConfig(num_workers=0))
    assert isinstance(loader, SeededDataLoader) and loader.epoch == 0
    e0 = batches(loader)
    assert loader.epoch == 1
    e1 = batches(loader)
    assert e1 != e0 and sorted(sum(e1, [])) == sorted(sum(e0, []))
    set_epoch(loader, 0)
    assert batches(loader) == e0
    loader.set_epoch(1)
    assert batches(loader) == e1


def draws(loader) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for b in loader:
        for k in range(len(b["i"])):
            w = int(b["worker"][k])
            out.setdefault(w, []).append(
                (float(b["py"][k]), float(b["np"][k]), float(b["torch"][k]))
            )
    return out


def test_workers_draw_distinct_reproducible_streams():
    factory = DataLoaderFactory()
    config = DataLoaderConfig(batch_size=2, shuffle=False, num_workers=2, persistent_workers=False)
    loader = factory.create_dataloader(RandomDraws(), config)
    a = draws(loader)  # epoch 0
    assert sorted(a) == [0, 1]
    for kind in range(3):  # random, numpy, torch: no value shared by the two workers
        assert not {d[kind] for d in a[0]} & {d[kind] for d in a[1]}
    b = draws(loader)  # epoch 1: new seeds
    assert a[0] != b[0] and a[1] != b[1]
    again = factory.create_dataloader(RandomDraws(), config)
    assert draws(again) == a  # a rerun draws the same numbers
    set_epoch(again, 1)
    assert draws(again) == b
    other_seed = factory.create_dataloader(
        RandomDraws(), DataLoaderConfig(batch_size=2, shuffle=False, num_workers=2, seed=1)
    )
    assert draws(other_seed)[0] != a[0]
    # the worker's numbers are those of worker_seed(seed, epoch, rank, worker)
    random.seed(worker_seed(42, 0, 0, 1))
    assert a[1][0][0] == random.random()


def test_distributed_uses_a_seeded_distributed_sampler():
    data = tensors(21)
    parts = []
    for rank in range(2):
        config = DataLoaderConfig(
            batch_size=4, num_workers=0, distributed=True, world_size=2, rank=rank, seed=5
        )
        loader = DataLoaderFactory().create_dataloader(data, config)
        assert isinstance(loader.sampler, DistributedSampler)
        assert (loader.sampler.seed, loader.sampler.rank, loader.sampler.num_replicas) == (
            5,
            rank,
            2,
        )
        parts.append(sum(batches(loader), []))
        assert loader.sampler.epoch == 1  # moved on after the full pass
        set_epoch(loader, 3)
        assert loader.sampler.epoch == 3
    assert len(parts[0]) == len(parts[1]) == 11  # 21 padded to 22
    assert set(parts[0]) | set(parts[1]) == set(range(21))


def test_set_epoch_on_plain_loaders():
    sampler = DistributedSampler(tensors(8), num_replicas=2, rank=0)
    plain = DataLoader(tensors(8), sampler=sampler)
    set_epoch(plain, 4)
    assert sampler.epoch == 4
    with pytest.raises(TypeError, match="set_epoch expects a loader made by"):
        set_epoch(DataLoader(tensors(8)), 1)


def test_inputs_lists_dicts_hf_and_iterable():
    factory = DataLoaderFactory()
    config = DataLoaderConfig(batch_size=4, shuffle=False, num_workers=0)
    loader = factory.create_dataloader(tensors(6), config)
    assert type(loader.dataset).__name__ == "TensorDataset"
    assert batches(loader) == [[0, 1, 2, 3], [4, 5]]
    rows = [{"x": torch.tensor([float(i)]), "y": i} for i in range(5)]
    first = next(iter(factory.create_dataloader(rows, config)))
    assert first["y"].tolist() == [0, 1, 2, 3] and first["x"].shape == (4, 1)
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"y": list(range(10))})
    hf_batches = [b["y"].tolist() for b in factory.create_dataloader(hf, config)]
    assert hf_batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    iterable = factory.create_dataloader(Count(), DataLoaderConfig(batch_size=4, num_workers=0))
    assert [b.tolist() for b in iterable] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_input_and_config_errors():
    factory = DataLoaderFactory()
    with pytest.raises(ValueError, match=r"item 0 has shape \(2,\), item 1 has \(3,\)"):
        factory.create_dataloader([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError, match="only tensors or only dicts"):
        factory.create_dataloader([torch.zeros(2), {"a": 1}])
    with pytest.raises(ValueError, match="the list of samples is empty"):
        factory.create_dataloader([])
    with pytest.raises(TypeError, match="cannot load int"):
        factory.create_dataloader(3)
    with pytest.raises(ValueError, match="distributed=True needs a map-style dataset"):
        factory.create_dataloader(
            Count(), DataLoaderConfig(distributed=True, world_size=2, rank=0, num_workers=0)
        )
    with pytest.raises(ValueError, match="tokenizer= is used by a collator"):
        factory.create_dataloader(tensors(), DataLoaderConfig(num_workers=0), tokenizer=object())
    with pytest.raises(ValueError, match=r"\['fields'\] apply only to a built shard dataset"):
        factory.create_dataloader(tensors(), DataLoaderConfig(num_workers=0), fields=["x"])
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        DataLoaderConfig(batch_size=0)
    with pytest.raises(ValueError, match="need distributed=True"):
        DataLoaderConfig(world_size=2)
    with pytest.raises(ValueError, match="rank 2 is not below world_size 2"):
        DataLoaderConfig(distributed=True, world_size=2, rank=2)
    with pytest.raises(RuntimeError, match="initialised torch.distributed process group"):
        DataLoaderFactory().create_dataloader(tensors(), DataLoaderConfig(distributed=True))


def test_automatic_worker_options():
    factory = DataLoaderFactory()
    with_workers = factory.create_dataloader(tensors(), DataLoaderConfig(num_workers=2))
    assert with_workers.persistent_workers is True and with_workers.prefetch_factor == 2
    assert with_workers.pin_memory == torch.cuda.is_available()
    no_workers = factory.create_dataloader(tensors(), DataLoaderConfig(num_workers=0))
    assert no_workers.persistent_workers is False and no_workers.prefetch_factor is None
    pinned = factory.create_dataloader(tensors(), DataLoaderConfig(num_workers=0, pin_memory=False))
    assert pinned.pin_memory is False


def test_shard_options_that_the_config_gives_are_an_error(shards):
    from wdsloader import Topology, WorkerOptions

    factory = DataLoaderFactory()
    config = DataLoaderConfig(batch_size=4, num_workers=1, distributed=True, rank=0, world_size=2)
    with pytest.raises(ValueError) as err:
        factory.create_dataloader(
            shards, config, split="val", workers=WorkerOptions(), topology=Topology()
        )
    assert str(err.value) == (
        "['topology', 'workers'] would contradict the DataLoaderConfig, which gives them (set "
        "num_workers, prefetch_factor, persistent_workers, distributed, rank and world_size there)"
    )


def test_create_optimized_dataloader_as_seed_002_documents():
    train = create_optimized_dataloader(tensors(50), batch_size=8, num_workers=0)
    assert train.drop_last is True and len(train) == 6
    assert batches(train)[0] != list(range(8))
    val = create_optimized_dataloader(tensors(50), batch_size=8, is_training=False, num_workers=0)
    assert val.drop_last is False and sum(batches(val), []) == list(range(50))
    ddp = create_optimized_dataloader(tensors(50), 8, world_size=2, rank=1, num_workers=0, seed=3)
    sampler = ddp.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.rank, sampler.seed, sampler.shuffle, sampler.drop_last) == (1, 3, True, True)


def test_seed_worker_seeds_numpy_and_random_from_torch():
    torch.manual_seed(1234)
    seed_worker(0)
    assert np.random.rand() == np.random.RandomState(1234).rand()
    assert random.random() == random.Random(1234).random()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("factory") / "ds"
    write_dataset(str(root), {"train": [20, 17, 23], "val": [9]})
    return str(root)


def test_shard_dataset_goes_through_our_loader(shards):
    config = DataLoaderConfig(batch_size=8, num_workers=2, seed=11, drop_last=True)
    loader = DataLoaderFactory().create_dataloader(shards, config, split="train")
    assert isinstance(loader, WdsDataLoader)
    assert loader.dataset_obj.config.seed == 11 and loader.persistent_workers
    direct = create_loader(
        shards, "train", 8, num_workers=2, seed=11, shuffle=True, drop_last=True,
        persistent_workers=True, prefetch_factor=2,
    )  # fmt: skip
    ours = [b["idx"].tolist() for b in loader]
    assert ours == [b["idx"].tolist() for b in direct]
    assert len(ours) == 7 and loader.dataset_obj.epoch == 1
    set_epoch(loader, 0)
    assert [b["idx"].tolist() for b in loader] == ours
    val = DataLoaderFactory().create_dataloader(
        shards, DataLoaderConfig(batch_size=4, shuffle=False, num_workers=0), split="val"
    )
    assert [b["idx"].tolist() for b in val] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
