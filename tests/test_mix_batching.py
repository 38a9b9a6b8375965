"""The registry of mix batching strategies (wdsloader.plan.batching): the built-in two by name, a
strategy registered by a test used end to end through create_loader(Mix(..., batching=name)) with every
sample once per epoch and exact resume on its topology, and the registry's errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.dataset_factory import write_dataset
from tests.test_mix_plan import FAST, epoch_multiset, mix_epochs, pairs
from wdsloader import Topology, WorkerOptions, create_loader
from wdsloader.errors import StateMismatchError
from wdsloader.mix import Mix, MixSource, MixSpec
from wdsloader.plan import Resume
from wdsloader.plan.batching import (
    GlobalBatching,
    MixedBatching,
    StratifiedBatching,
    batching_strategies,
    get_batching_strategy,
    register_batching_strategy,
    unregister_batching_strategy,
)
from wdsloader.plan.mix import (
    MixEpoch,
    MixTopology,
    mix_num_batches,
    mix_plan_config,
    mix_rank_batches,
)


class SequentialBatching(GlobalBatching):
    """A third strategy: the epoch's samples in source order (all of source 0's quota, then
    source 1's...), cut into global batches in that order."""

    name = "sequential"

    def slots(self, me: MixEpoch, topo: MixTopology):
        g = topo.world_size * topo.batch_size
        q = np.asarray(me.quotas, dtype=np.int64)
        first = np.cumsum(q) - q

        def at(t: int, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            p = t * g + pos
            src = np.searchsorted(first, p, side="right") - 1
            return src, p - first[src]

        return at


@pytest.fixture
def sequential():
    register_batching_strategy(SequentialBatching())
    yield "sequential"
    unregister_batching_strategy("sequential")


def test_the_registry_lists_mixed_and_stratified():
    import wdsloader.mix

    assert wdsloader.mix.register_batching_strategy is register_batching_strategy
    assert wdsloader.mix.GlobalBatching is GlobalBatching
    assert batching_strategies() == ("mixed", "stratified")
    assert isinstance(get_batching_strategy("mixed"), MixedBatching)
    assert isinstance(get_batching_strategy("stratified"), StratifiedBatching)
    assert (
        get_batching_strategy("mixed").elastic and not get_batching_strategy("stratified").elastic
    )


def test_registry_errors(sequential):
    assert batching_strategies() == ("mixed", "stratified", "sequential")
    with pytest.raises(
        ValueError,
        match=r"batching must be one of \('mixed', 'stratified', 'sequential'\), got 'x'",
    ):
        get_batching_strategy("x")
    with pytest.raises(ValueError, match=r"batching must be 'mixed', 'stratified' or 'sequential'"):
        MixTopology(batch_size=2, batching="x")
    with pytest.raises(ValueError, match=r"'sequential' is already registered; pass replace=True"):
        register_batching_strategy(SequentialBatching())
    other = SequentialBatching()
    register_batching_strategy(other, replace=True)
    assert get_batching_strategy("sequential") is other
    mixed = type("Mixed", (SequentialBatching,), {"name": "mixed"})
    with pytest.raises(ValueError, match=r"'mixed' is built in and cannot be replaced"):
        register_batching_strategy(mixed(), replace=True)
    with pytest.raises(ValueError, match=r"'stratified' is built in and cannot be unregistered"):
        unregister_batching_strategy("stratified")
    with pytest.raises(TypeError, match=r"needs name, elastic, num_batches.*got <object"):
        register_batching_strategy(object())
    bad = type("Bad", (SequentialBatching,), {"name": "No Spaces"})
    with pytest.raises(ValueError, match=r"'No Spaces' must be lower-case letters, digits and '_'"):
        register_batching_strategy(bad())


@FAST
@given(
    me=mix_epochs(max_quota=30),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.integers(1, 5),
    drop_last=st.booleans(),
)
def test_a_strategy_over_global_batches_delivers_the_epoch(me, world, workers, batch, drop_last):
    register_batching_strategy(SequentialBatching())
    try:
        topo = MixTopology(batch_size=batch, world_size=world, num_workers=workers,
                           drop_last=drop_last, batching="sequential")  # fmt: skip
        n = mix_num_batches(me, topo)
        ranks = [mix_rank_batches(me, topo, r) for r in range(world)]
    finally:
        unregister_batching_strategy("sequential")
    assert [len(r) for r in ranks] == [n] * world
    g = world * batch
    got = sum((pairs(r) for r in ranks if r), Counter())
    want = epoch_multiset(me)
    if drop_last:
        assert n == me.length // g and not got - want and me.length - sum(got.values()) < g
    else:
        assert n == -(-me.length // g) and not want - got
        assert sum(got.values()) - me.length == topo.strategy.padding(me, topo) < world
    # global batch t is positions [t * g, (t + 1) * g) of the sources' quotas in source order
    order = np.repeat(np.arange(len(me.quotas)), me.quotas)
    for t in range(me.length // g):
        src = np.concatenate([ranks[r][t][0] for r in range(world)])
        assert src.tolist() == order[t * g : (t + 1) * g].tolist()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("batching")
    write_dataset(str(root / "a"), {"train": [12]})
    write_dataset(str(root / "b"), {"train": [8, 10]})
    return root


def _loader(data: Path, rank: int, batching="sequential", num_workers=2, context=None):
    srcs = [MixSource(data / "a", repeat=1), MixSource(data / "b", repeat=1)]
    mix = Mix(srcs, batching=batching, source_field="src")
    return create_loader(
        mix, "train", 3, num_workers, seed=3, topology=Topology(rank=rank, world_size=2),
        workers=WorkerOptions(multiprocessing_context=context) if context else None,
    )  # fmt: skip


def _batches(loader, stop: int | None = None):
    out = []
    for b in loader:
        out.append(list(zip(b["src"].tolist(), b["idx"].tolist(), strict=True)))
        if len(out) == stop:
            return out, json.loads(json.dumps(loader.state_dict()))
    return out, None


def test_a_registered_strategy_is_used_by_create_loader_exactly_once_per_epoch(data, sequential):
    loaders = [_loader(data, r) for r in range(2)]
    assert [len(ld) for ld in loaders] == [5, 5]  # 30 samples in global batches of 2 x 3
    for epoch in range(2):
        runs = [_batches(ld)[0] for ld in loaders]
        seen = Counter(x for run in runs for batch in run for x in batch)
        assert seen == Counter([(0, i) for i in range(12)] + [(1, i) for i in range(18)])
        for rank, run in enumerate(runs):  # in source order: slots j*6 + rank*3 + (0, 1, 2)
            want = [[int(j * 6 + rank * 3 + i >= 12) for i in range(3)] for j in range(5)]
            assert [[s for s, _ in batch] for batch in run] == want, epoch
    assert ":sequential:" in loaders[0].fingerprint["mix"]


def test_a_registered_strategy_resumes_on_its_topology_only(data, sequential):
    full, _ = _batches(_loader(data, 1))
    head, state = _batches(_loader(data, 1), stop=2)
    again = _loader(data, 1)
    again.load_state_dict(state)
    assert head + _batches(again)[0] == full
    with pytest.raises(
        StateMismatchError,
        match=r'batching="sequential" resumes only on the topology it was saved with .*'
        r'use batching="mixed" for elastic resume',
    ):
        _loader(data, 1, num_workers=1).load_state_dict(state)


def test_an_unknown_batching_lists_the_registered_ones(data, sequential):
    with pytest.raises(
        ValueError,
        match=r"batching must be one of \('mixed', 'stratified', 'sequential'\), got 'nope'",
    ):
        _loader(data, 0, batching="nope")
    spec = _loader(data, 0).dataset_obj.mix
    assert isinstance(spec, MixSpec) and spec.batching == "sequential"


def test_a_strategy_that_is_not_elastic_refuses_a_chained_resume(sequential):
    me = MixEpoch(sizes=(6, 6), quotas=(6, 6), offsets=(0, 0))
    topo = MixTopology(batch_size=2, batching="sequential")
    first = Resume(mix_plan_config(me, topo), 1)
    assert mix_num_batches(me, topo, first) == mix_num_batches(me, topo) - 1
    wide = MixTopology(batch_size=2, world_size=2, batching="sequential")
    chain = Resume(mix_plan_config(me, topo), 1, Resume(mix_plan_config(me, wide), 1))
    with pytest.raises(ValueError, match=r'batching="sequential" resumes only on the topology'):
        mix_num_batches(me, topo, chain)


def test_a_strategy_that_cannot_reach_spawned_workers_is_refused_at_creation(data):
    class Local(SequentialBatching):  # a local class: pickled by reference, it cannot be found
        name = "local"

    register_batching_strategy(Local())
    try:
        with pytest.raises(
            ValueError,
            match=r"the mix plan \(its batching strategy or weights schedule\) cannot be sent to "
            r"DataLoader workers started by 'spawn' .*local object",
        ):
            _loader(data, 0, batching="local", context="spawn")
        _loader(data, 0, batching="local", context="fork")  # fork inherits it
    finally:
        unregister_batching_strategy("local")
