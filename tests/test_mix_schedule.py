"""MultiDataLoader: the schedule of every strategy and policy, its errors, cycling, resume."""

from __future__ import annotations

import itertools
import json
import logging

import numpy as np
import pytest

import wdsloader
from wdsloader.errors import StateMismatchError
from wdsloader.mix import (
    EpochLengthPolicy,
    MultiDataLoader,
    MultiDataLoaderConfig,
    SamplingStrategy,
    epoch_schedule,
    epoch_steps,
)
from wdsloader.plan.quotas import even_interleave, largest_remainder

C = MultiDataLoaderConfig
S = SamplingStrategy
P = EpochLengthPolicy


def sched(config: MultiDataLoaderConfig, lengths, epoch: int = 0) -> list[int]:
    return epoch_schedule(config, lengths, epoch).tolist()


class Endless:
    """An iterable without a length."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __iter__(self):
        return (f"{self.tag}{i}" for i in itertools.count())


def lists(*lengths: int) -> list[list[str]]:
    return [[f"{'abcdefgh'[j]}{i}" for i in range(n)] for j, n in enumerate(lengths)]


# ------------------------------------------------------------------------------ primitives


def test_largest_remainder_is_exact_and_breaks_ties_to_the_lower_index():
    assert largest_remainder([0.7, 0.3], 10).tolist() == [7, 3]
    assert largest_remainder([0.6, 0.3, 0.1], 7).tolist() == [4, 2, 1]
    assert largest_remainder([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert largest_remainder([1, 1, 1], 2).tolist() == [1, 1, 0]
    assert largest_remainder([0, 5], 3).tolist() == [0, 3]
    assert largest_remainder([1e-300, 1.0], 1).tolist() == [0, 1]


def test_even_interleave_spreads_each_index_evenly():
    assert even_interleave([2, 3, 1]).tolist() == [1, 0, 1, 2, 0, 1]
    assert even_interleave([1, 9]).tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    assert even_interleave([3, 3]).tolist() == [0, 1, 0, 1, 0, 1]
    assert even_interleave([0, 2]).tolist() == [1, 1]
    rng = np.random.default_rng(0)
    for _ in range(300):  # two loaders: every prefix within one step of its exact share
        q = rng.integers(0, 40, 2)
        if q.sum() == 0:
            continue
        s = even_interleave(q)
        assert np.bincount(s, minlength=2).tolist() == q.tolist()
        t = np.arange(1, s.size + 1)
        dev = np.abs(np.cumsum(s == 1) - t * q[1] / q.sum())
        assert dev.max() < 1.0


# ------------------------------------------------------------------------------- schedules


def test_round_robin_with_each_policy_and_burst():
    assert sched(C(), [3, 1, 2]) == [0, 1, 2, 0, 1, 2]
    assert sched(C(epoch_length_policy=P.MAX_OF_LENGTHS), [3, 1, 2]) == [0, 1, 2]
    assert sched(C(epoch_length_policy=P.MIN_OF_LENGTHS), [3, 1, 2]) == [0]
    fixed = C(epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=7, burst_size=2)
    assert sched(fixed, [3, 1, 2]) == [0, 0, 1, 1, 2, 2, 0]
    assert sched(C(burst_size=3), [2, 2]) == [0, 0, 0, 1]


def test_sequential_with_each_policy():
    seq = S.SEQUENTIAL
    assert sched(C(sampling_strategy=seq), [3, 1, 2]) == [0, 0, 0, 1, 2, 2]
    assert sched(C(sampling_strategy=seq, epoch_length_policy=P.MAX_OF_LENGTHS), [3, 1, 2]) == [
        *[0] * 3,
        *[1] * 3,
        *[2] * 3,
    ]
    assert sched(C(sampling_strategy=seq, epoch_length_policy=P.MIN_OF_LENGTHS), [3, 1, 2]) == [
        0,
        1,
        2,
    ]
    fixed = C(sampling_strategy=seq, epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=8)
    assert sched(fixed, [3, None, 2]) == [0, 0, 0, 1, 1, 1, 2, 2]


def test_weighted_quotas_are_exact_and_evenly_interleaved():
    w = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[2, 3, 1])
    assert sched(w, [2, 2, 2]) == [1, 0, 1, 2, 0, 1]  # SUM: 6 steps, quotas 2/3/1
    mx = C(sampling_strategy="weighted", dataloader_weights=[0.6, 0.3, 0.1])
    s = epoch_schedule(C(**{**mx.__dict__, "epoch_length_policy": P.FIXED_NUM_STEPS,
                            "steps_per_epoch": 1001}), [5, 5, 5])  # fmt: skip
    assert np.bincount(s).tolist() == [601, 300, 100]
    assert epoch_steps(C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1],
                         epoch_length_policy=P.MAX_OF_LENGTHS), [4, None]) == 4  # fmt: skip
    assert epoch_steps(C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1],
                         epoch_length_policy=P.MIN_OF_LENGTHS), [4, 9]) == 4  # fmt: skip
    # the same every epoch without choice_rng_seed
    assert sched(w, [2, 2, 2], epoch=5) == sched(w, [2, 2, 2], epoch=0)


def test_weighted_bursts_keep_the_quotas_exact():
    w = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[2, 3, 1], burst_size=2)
    assert sched(w, [2, 2, 2]) == [1, 1, 0, 0, 2, 1]
    w3 = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1], burst_size=3)
    assert sched(w3, [4, 4]) == [0, 0, 0, 1, 1, 1, 0, 1]


def test_weighted_with_choice_rng_seed_is_a_seeded_permutation_of_the_same_quotas():
    def seeded(seed):
        return C(sampling_strategy=S.WEIGHTED, dataloader_weights=[0.5, 0.3, 0.2],
                 choice_rng_seed=seed)  # fmt: skip

    lengths = [40, 40, 20]
    a0, a1 = sched(seeded(7), lengths, 0), sched(seeded(7), lengths, 1)
    assert a0 == sched(seeded(7), lengths, 0)  # deterministic
    assert a0 != a1 and a0 != sched(seeded(8), lengths, 0)  # new per epoch and per seed
    for s in (a0, a1):
        assert np.bincount(s).tolist() == [50, 30, 20]
    assert a0 != sched(C(sampling_strategy=S.WEIGHTED, dataloader_weights=[0.5, 0.3, 0.2]),
                       lengths)  # fmt: skip


def test_alternating_pattern_with_burst():
    alt = C(sampling_strategy=S.ALTERNATING, alternating_pattern=[0, 0, 1])
    assert sched(alt, [3, 1, 2]) == [0, 0, 1, 0, 0, 1]  # SUM: 6 steps
    burst = C(sampling_strategy=S.ALTERNATING, alternating_pattern=[1, 0], burst_size=2,
              epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=5)  # fmt: skip
    assert sched(burst, [None, None]) == [1, 1, 0, 0, 1]


def test_without_cycling_a_loader_steps_past_its_length_are_left_out():
    assert sched(C(cycle_short_loaders=False), [3, 1, 2]) == [0, 1, 2, 0, 2]
    w = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1], cycle_short_loaders=False,
          epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=8)  # fmt: skip
    assert sched(w, [1, None]) == [0, 1, 1, 1, 1]


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sampling_strategy": "random"}, r"SamplingStrategy: unknown value 'random'; valid: "),
        ({"epoch_length_policy": "all"}, r"EpochLengthPolicy: unknown value 'all'"),
        ({"sampling_strategy": S.WEIGHTED}, r"Weights required for WEIGHTED strategy"),
        (
            {"sampling_strategy": S.WEIGHTED, "dataloader_weights": [0, 0]},
            r"dataloader_weights must sum to more than 0, got \[0, 0\]",
        ),
        (
            {"sampling_strategy": S.WEIGHTED, "dataloader_weights": [1, -1]},
            r"dataloader_weights\[1\] = -1 must be a finite number >= 0",
        ),
        (
            {"sampling_strategy": S.WEIGHTED, "dataloader_weights": [1, float("nan")]},
            r"dataloader_weights\[1\] = nan must be a finite number",
        ),
        ({"sampling_strategy": S.ALTERNATING}, r"Pattern required for ALTERNATING strategy"),
        (
            {"sampling_strategy": S.ALTERNATING, "alternating_pattern": []},
            r"Pattern required for ALTERNATING",
        ),
        (
            {
                "sampling_strategy": S.ALTERNATING,
                "alternating_pattern": [0],
                "epoch_length_policy": P.MAX_OF_LENGTHS,
            },
            r"ALTERNATING takes its length from SUM_OF_LENGTHS or FIXED_NUM_STEPS, not MAX_OF",
        ),
        (
            {"epoch_length_policy": P.FIXED_NUM_STEPS},
            r"steps_per_epoch required for FIXED_NUM_STEPS",
        ),
        ({"steps_per_epoch": 5}, r"steps_per_epoch=5 would be unused: .*SUM_OF_LENGTHS"),
        ({"dataloader_weights": [1, 2]}, r"dataloader_weights would be unused: .*ROUND_ROBIN"),
        ({"choice_rng_seed": 1}, r"choice_rng_seed would be unused"),
        ({"alternating_pattern": [0]}, r"alternating_pattern would be unused"),
        (
            {"sampling_strategy": S.SEQUENTIAL, "burst_size": 2},
            r"burst_size=2 would be unused: SEQUENTIAL",
        ),
        ({"burst_size": 0}, r"burst_size"),
        ({"dataloader_names": "ab"}, r"dataloader_names must be a list of non-empty strings"),
        ({"cycle_short_loaders": 1}, r"cycle_short_loaders must be a bool"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        C(**kwargs)


@pytest.mark.parametrize(
    ("config", "lengths", "match"),
    [
        (
            C(dataloader_names=["a", "b"]),
            [1, 1, 1],
            r"Number of dataloader names \(2\) doesn't match number of loaders \(3\)",
        ),
        (
            C(dataloader_names=["a", "b", "a"]),
            [1, 1, 1],
            r"Dataloader names must be unique: \['a', 'b', 'a'\] repeats \['a'\]",
        ),
        (
            C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 2]),
            [1, 1, 1],
            r"Number of dataloader_weights must match number of loaders: got 2 weights for 3",
        ),
        (
            C(sampling_strategy=S.ALTERNATING, alternating_pattern=[0, 3]),
            [1, 1, 1],
            r"alternating_pattern\[1\] = 3 is not the index of one of the 3 loaders",
        ),
        (
            C(dataloader_names=["a", "inf"]),
            [1, None],
            r"ROUND_ROBIN with SUM_OF_LENGTHS: loaders \['inf'\] have no length; use FIXED_NUM",
        ),
        (
            C(sampling_strategy=S.SEQUENTIAL, epoch_length_policy=P.MAX_OF_LENGTHS),
            [None, 2],
            r"SEQUENTIAL with MAX_OF_LENGTHS: loaders \['dl0'\] have no length",
        ),
        (
            C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1]),
            [None, 2],
            r"WEIGHTED with SUM_OF_LENGTHS: loaders \['dl0'\] have no length",
        ),
        (
            C(
                sampling_strategy=S.WEIGHTED,
                dataloader_weights=[1, 1],
                epoch_length_policy=P.MIN_OF_LENGTHS,
            ),  # fmt: skip
            [None, 2],
            r"WEIGHTED with MIN_OF_LENGTHS: loaders \['dl0'\] have no length",
        ),
        (
            C(
                sampling_strategy=S.WEIGHTED,
                dataloader_weights=[1, 1],
                epoch_length_policy=P.MAX_OF_LENGTHS,
            ),  # fmt: skip
            [None, None],
            r"WEIGHTED with MAX_OF_LENGTHS: no loader has a length; use FIXED_NUM_STEPS",
        ),
        (
            C(sampling_strategy=S.ALTERNATING, alternating_pattern=[0]),
            [None, 2],
            r"ALTERNATING with SUM_OF_LENGTHS: loaders \['dl0'\] have no length",
        ),
    ],
)
def test_errors_against_the_loaders(config, lengths, match):
    with pytest.raises(ValueError, match=match):
        epoch_schedule(config, lengths)


def test_constructor_errors():
    with pytest.raises(ValueError, match="MultiDataLoader needs a non-empty list of loaders"):
        MultiDataLoader([])
    with pytest.raises(TypeError, match="config must be a MultiDataLoaderConfig, got dict"):
        MultiDataLoader([[1]], {"sampling_strategy": "weighted"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Number of dataloader names \(1\)"):
        MultiDataLoader([[1], [2]], C(dataloader_names=["x"]))


# ------------------------------------------------------------------------------- iteration


def test_iteration_yields_index_name_batch_and_moves_to_the_next_epoch():
    mdl = MultiDataLoader(lists(3, 1), C(dataloader_names=["web", "code"]))
    assert len(mdl) == 4
    steps = list(mdl)
    assert [(s.idx, s.name, s.batch) for s in steps] == [
        (0, "web", "a0"), (1, "code", "b0"), (0, "web", "a1"), (1, "code", "b0"),
    ]  # fmt: skip
    assert mdl.epoch == 1 and mdl.state_dict()["position"] == 0


def test_a_short_loader_cycles_and_an_empty_one_is_an_error():
    mdl = MultiDataLoader(lists(1, 4), C(sampling_strategy=S.SEQUENTIAL,
                                         epoch_length_policy=P.MAX_OF_LENGTHS))  # fmt: skip
    assert [s.batch for s in mdl] == ["a0"] * 4 + ["b0", "b1", "b2", "b3"]

    class Hollow(list):  # claims a length, yields nothing (len() 0 is refused up front)
        def __len__(self):
            return 1

    empty = MultiDataLoader([Hollow(), ["b0"]],
                            C(epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=2))  # fmt: skip
    with pytest.raises(RuntimeError, match=r"Loader 'dl0' exhausted even after cycling"):
        list(empty)


def test_cycles_are_counted_in_the_state():
    mdl = MultiDataLoader(lists(2, 5), C())
    it = iter(mdl)
    got = [next(it).batch for _ in range(7)]
    assert got == ["a0", "b0", "a1", "b1", "a0", "b2", "a1"]
    rows = mdl.state_dict()["loaders"]
    assert [(r["batches"], r["cycles"]) for r in rows] == [(2, 1), (3, 0)]
    assert mdl.state_dict()["position"] == 7


def test_a_loader_shorter_than_its_len_without_cycling_skips_its_slots(caplog):
    class Liar(list):
        def __len__(self):
            return 3

    mdl = MultiDataLoader([Liar(["a0"]), ["b0", "b1", "b2"]], C(cycle_short_loaders=False))
    with caplog.at_level(logging.WARNING, logger="wdsloader.mix.multi"):
        assert [s.batch for s in mdl] == ["a0", "b0", "b1", "b2"]
    assert "loader 'dl0' ran out after 1 batches, before the 3 of its len()" in caplog.text


def test_infinite_loaders_with_fixed_steps():
    mdl = MultiDataLoader(
        [Endless("x"), ["y0"]],
        C(
            sampling_strategy=S.WEIGHTED,
            dataloader_weights=[3, 1],
            epoch_length_policy=P.FIXED_NUM_STEPS,
            steps_per_epoch=8,
        ),  # fmt: skip
    )
    assert len(mdl) == 8
    assert [s.batch for s in mdl] == ["x0", "x1", "y0", "x2", "x3", "x4", "y0", "x5"]


def test_set_epoch_reaches_samplers_and_loaders():
    class WithSampler(list):
        class _S:
            epoch = None

            def set_epoch(self, e):
                self.epoch = e

        sampler = _S()

    class WithSetEpoch(list):
        epoch = None

        def set_epoch(self, e):
            self.epoch = e

    a, b = WithSampler(["a"]), WithSetEpoch(["b"])
    mdl = MultiDataLoader([a, b])
    mdl.set_epoch(4)
    list(mdl)
    assert a.sampler.epoch == 4 and b.epoch == 4 and mdl.epoch == 5


def test_top_level_exports():
    assert wdsloader.MultiDataLoader is MultiDataLoader
    assert wdsloader.SamplingStrategy is SamplingStrategy
    assert wdsloader.mix.EpochLengthPolicy is EpochLengthPolicy  # not top level: a config field
    assert wdsloader.MultiDataLoaderConfig is MultiDataLoaderConfig


# ---------------------------------------------------------------------------------- resume


def _run(mdl, steps=None):
    out = []
    for s in mdl:
        out.append((s.name, s.batch))
        if steps is not None and len(out) == steps:
            break
    return out


def test_plain_loaders_resume_by_skipping_with_a_warning(caplog):
    config = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[0.5, 0.5])
    full = _run(MultiDataLoader(lists(3, 5), config))
    first = MultiDataLoader(lists(3, 5), config)
    head = _run(first, steps=7)  # loader a is in its second pass
    state = json.loads(json.dumps(first.state_dict()))
    assert [(r["batches"], r["cycles"]) for r in state["loaders"]] == [(1, 1), (3, 0)]
    second = MultiDataLoader(lists(3, 5), config)
    second.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="wdsloader.mix.multi"):
        tail = _run(second)
    assert head + tail == full
    assert "loader 'dl1' (list) has no state_dict; resuming it by reading and dropping the 3" in (
        caplog.text
    )
    assert second.epoch == 1
    # stopped at the end of a's first pass: resuming skips it whole, then a starts its second
    third = MultiDataLoader(lists(3, 5), config)
    head = _run(third, steps=6)
    fourth = MultiDataLoader(lists(3, 5), config)
    fourth.load_state_dict(third.state_dict())
    assert head + _run(fourth) == full


def test_state_mismatches_are_refused():
    config = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1])
    state = MultiDataLoader(lists(2, 2), config).state_dict()
    other = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[2, 1])
    with pytest.raises(
        StateMismatchError, match=r"config differs \(dataloader_weights: saved \[1.0, 1.0\], now"
    ):
        MultiDataLoader(lists(2, 2), other).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"lengths were \[2, 2\] and are now \[2, 3\]"):
        MultiDataLoader(lists(2, 3), config).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"not a MultiDataLoader state"):
        MultiDataLoader(lists(2, 2), config).load_state_dict({"epoch": 0})
    named = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[1, 1], dataloader_names=["x", "y"])
    with pytest.raises(StateMismatchError, match=r"config differs \(dataloader_names"):
        MultiDataLoader(lists(2, 2), named).load_state_dict(state)


def test_torchdata_stateful_dataloaders_resume_exactly(caplog):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    import torch

    def loaders():
        # the short loader cycles: unshuffled, as torchdata's own resume replays the pass after
        # the one it resumed in with another order (its generator restarts at the saved pass)
        return [
            sdl.StatefulDataLoader(list(range(10)), batch_size=2, shuffle=True,
                                   generator=torch.Generator().manual_seed(1)),
            sdl.StatefulDataLoader(list(range(100, 104)), batch_size=2),
        ]  # fmt: skip

    config = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[0.4, 0.6],
               epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=9)  # fmt: skip

    def run(mdl, steps=None, epochs=2):
        out = []
        for _ in range(epochs):
            for s in mdl:
                out.append((s.idx, s.batch.tolist()))
                if steps is not None and len(out) == steps:
                    return out
        return out

    full = run(MultiDataLoader(loaders(), config))
    first = MultiDataLoader(loaders(), config)
    head = run(first, steps=14)  # epoch 1 (9 steps each), both loaders mid-pass
    state = first.state_dict()
    assert [(r["batches"], r["cycles"]) for r in state["loaders"]] == [(2, 0), (1, 1)]
    second = MultiDataLoader(loaders(), config)
    second.load_state_dict(state)
    assert second.epoch == 1
    with caplog.at_level(logging.WARNING, logger="wdsloader.mix.multi"):
        assert head + run(second, epochs=1) == full
    assert "no state_dict" not in caplog.text


@pytest.fixture(scope="module")
def three_datasets(tmp_path_factory):
    from tests.dataset_factory import write_dataset

    root = tmp_path_factory.mktemp("mix3")
    for name, counts in {"web": [30, 20], "code": [12], "tiny": [5]}.items():
        write_dataset(str(root / name), {"train": counts})
    return root


def _ours(root):
    from wdsloader import create_loader

    loaders = [create_loader(str(root / n), "train", 4, seed=2) for n in ("web", "code", "tiny")]
    config = C(sampling_strategy=S.WEIGHTED, dataloader_weights=[0.5, 0.3, 0.2],
               epoch_length_policy=P.FIXED_NUM_STEPS, steps_per_epoch=20)  # fmt: skip
    return MultiDataLoader(loaders, config)


def _keys(mdl, epochs=2, steps=None):
    out = []
    while mdl.epoch < epochs:
        e = mdl.epoch
        for s in mdl:
            out.append((e, s.name, list(s.batch["__key__"])))
            if steps is not None and len(out) == steps:
                return out
    return out


@pytest.mark.parametrize("stop", [7, 20, 33])  # mid-epoch 0, between epochs, mid-epoch 1
def test_our_loaders_resume_exactly(three_datasets, stop, caplog):
    full = _keys(_ours(three_datasets))
    assert len(full) == 40
    first = _ours(three_datasets)
    head = _keys(first, steps=stop)
    state = json.loads(json.dumps(first.state_dict()))
    second = _ours(three_datasets)
    second.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="wdsloader.mix.multi"):
        assert head + _keys(second) == full
    assert "no state_dict" not in caplog.text
    # each epoch sets every loader to it: a new order of web's samples in epoch 1
    web = [[k for e, n, k in full if e == epoch and n == "dl0"] for epoch in (0, 1)]
    assert len(web[0]) == len(web[1]) == 10 and web[0] != web[1]
