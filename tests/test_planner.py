"""The plan as the dataset asks it (wdsloader.plan.Planner): one source's SinglePlanner answers as
the plan functions, a mix's MixPlanner as the mix plan, and the dataset asks whichever it holds."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from wdsloader import Topology, create_loader, plan
from wdsloader.mix import MixSource, MixSpec
from wdsloader.mix.runtime import MixPlanner
from wdsloader.plan import PlanConfig, Planner, Resume, SinglePlanner
from wdsloader.plan.batching import register_batching_strategy, unregister_batching_strategy
from wdsloader.plan.mix import (
    MixTopology,
    mix_dropped,
    mix_num_batches,
    mix_padding,
    mix_worker_batches,
)

CFG = PlanConfig(
    counts=(7, 5, 9), batch_size=2, world_size=2, num_workers=2, seed=3, shuffle=True,
    drop_last=False, span=2, window=4,
)  # fmt: skip


def _lists(batches) -> list[list[int]]:
    return [np.asarray(b).tolist() for b in batches]


def test_the_single_planner_answers_as_the_plan_functions():
    planner = SinglePlanner(CFG)
    assert isinstance(planner, Planner)
    resume = Resume(CFG, 2)
    for epoch in (0, 1):
        assert planner.num_batches(epoch) == plan.num_batches(CFG, epoch=epoch)
        assert planner.num_batches(epoch, resume) == plan.num_batches(
            CFG, epoch=epoch, resume=resume
        )
        assert planner.padding(epoch) == plan.epoch_padding(CFG, epoch=epoch) > 0
        assert planner.dropped(epoch) == plan.epoch_dropped(CFG, epoch=epoch)
        for rank in range(2):
            for worker in range(2):
                for r in (None, resume):
                    want = plan.worker_batches(CFG, epoch, rank, worker, r)
                    got = planner.worker_batches(epoch, rank, worker, r)
                    assert _lists(got) == _lists(want)
    assert pickle.loads(pickle.dumps(planner)) == planner


@pytest.mark.parametrize("batching", ["mixed", "stratified"])
def test_the_mix_planner_answers_as_the_mix_plan(batching):
    sources = (MixSource("a", repeat=2), MixSource("b", weight=1.0), MixSource("c", samples=3))
    spec = MixSpec(sources=sources, sizes=(4, 9, 6), shards=(1, 2, 1), epoch_samples=20,
                   batching=batching)  # fmt: skip
    planner = MixPlanner(spec, CFG)
    assert isinstance(planner, Planner)
    topo = MixTopology(batch_size=2, world_size=2, num_workers=2, drop_last=False, window=4,
                       batching=batching)  # fmt: skip
    offsets = np.asarray([0, 4, 13])
    for epoch in (0, 1):
        me = spec.epoch(epoch, seed=CFG.seed, block=CFG.span)
        assert planner.num_batches(epoch) == mix_num_batches(me, topo)
        assert planner.padding(epoch) == mix_padding(me, topo)
        assert planner.dropped(epoch) == mix_dropped(me, topo)
        for rank in range(2):
            for worker in range(2):
                want = [offsets[s] + i for s, i in mix_worker_batches(me, topo, rank, worker)]
                assert _lists(planner.worker_batches(epoch, rank, worker, None)) == _lists(want)
    restored = pickle.loads(pickle.dumps(planner))
    assert type(restored.topology.strategy) is type(planner.topology.strategy)


def test_a_registered_strategy_travels_with_the_planner():
    """A strategy registered in the main process only (a spawned worker's registry lacks it)."""
    from tests.test_mix_batching import SequentialBatching

    spec_args = {"sources": (MixSource("a", repeat=1), MixSource("b", repeat=1)),
                 "sizes": (5, 8), "shards": (1, 1)}  # fmt: skip
    register_batching_strategy(SequentialBatching())
    try:
        planner = MixPlanner(MixSpec(**spec_args, batching="sequential"), CFG)
        sent = pickle.dumps(planner)
    finally:
        unregister_batching_strategy("sequential")
    worker = pickle.loads(sent)  # as a worker started by spawn receives it
    assert isinstance(worker.topology.strategy, SequentialBatching)
    got = [
        b for r in range(2) for w in range(2) for b in _lists(worker.worker_batches(0, r, w, None))
    ]
    ids = [i for b in got for i in b]  # every sample, one repeated to fill the last batches
    assert set(ids) == set(range(13)) and len(ids) == 13 + worker.padding(0) == 14


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("planner")
    write_dataset(str(root / "a"), {"train": [11]})
    write_dataset(str(root / "b"), {"train": [6, 7]})
    return root


def test_the_dataset_asks_its_planner(data):
    topology = Topology(rank=1, world_size=2)
    single = create_loader(str(data / "b"), "train", 4, drop_last=False, topology=topology)
    mixed = create_loader([MixSource(data / "a"), MixSource(data / "b")], "train", 4, epoch=1)
    for loader, kind in ((single, SinglePlanner), (mixed, MixPlanner)):
        ds = loader.dataset_obj
        assert isinstance(ds.planner, kind) and isinstance(ds.planner, Planner)
        assert len(loader) == ds.planner.num_batches(ds.epoch)
        assert (loader.padding, loader.dropped) == (
            ds.planner.padding(ds.epoch),
            ds.planner.dropped(ds.epoch),
        )
        want = _lists(ds.planner.worker_batches(ds.epoch, ds.rank, 0, None))
        assert _lists(ds.worker_batches(ds.epoch, 0, None)) == want
        seen = [b["idx"].tolist() for b in loader]
        assert sum(len(b) for b in seen) == sum(len(b) for b in want)


def test_shard_uses_are_each_shards_first_and_last_batch():
    from wdsloader.plan.uses import shard_uses

    counts = (7, 0, 12, 5, 9)
    cfg = PlanConfig(counts=counts, batch_size=4, num_workers=2, span=2, window=8, seed=1)
    batches = plan.worker_batches(cfg, 0, 0, 1, None)
    shard = [np.searchsorted(np.cumsum(counts), b, side="right") for b in batches]
    want = {}
    for i, ss in enumerate(shard):
        for s in set(ss.tolist()):
            first, _ = want.get(s, (i, i))
            want[s] = (first, i)
    got = shard_uses(batches, counts)
    assert [(s, a, b) for s, a, b in got] == sorted(
        ((s, a, b) for s, (a, b) in want.items()), key=lambda t: (t[1], t[0])
    )
