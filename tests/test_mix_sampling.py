"""MultiDataLoader's sampling strategies are one module each behind a registry: the built-in ones
give the schedules they gave before it (pinned), a strategy a user registers is used by
MultiDataLoader (and resumes exactly), and the typed state loads what the old untyped code saved
and refuses a tampered one."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import numpy as np
import pytest

from wdsloader.errors import StateMismatchError
from wdsloader.mix import MultiDataLoader, MultiDataLoaderConfig, epoch_schedule
from wdsloader.mix.multi_state import MultiState
from wdsloader.mix.sampling import (
    BaseSampling,
    SamplingStrategy,
    get_sampling_strategy,
    register_sampling_strategy,
    sampling_strategies,
    unregister_sampling_strategy,
)
from wdsloader.mix.sampling.base import cyclic

C = MultiDataLoaderConfig


def _grid() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pol in ("sum_of_lengths", "max_of_lengths", "min_of_lengths", "fixed_num_steps"):
        fixed = {"steps_per_epoch": 11} if pol == "fixed_num_steps" else {}
        for burst in (1, 3):
            common = {"epoch_length_policy": pol, "burst_size": burst, **fixed}
            out.append({"sampling_strategy": "round_robin", **common})
            out.append(
                {"sampling_strategy": "weighted", "dataloader_weights": [0.5, 0.3, 0.2], **common}
            )
            out.append(
                {
                    "sampling_strategy": "weighted",
                    "dataloader_weights": [3, 1, 1],
                    "choice_rng_seed": 42,
                    **common,
                }
            )
            if pol in ("sum_of_lengths", "fixed_num_steps"):
                out.append(
                    {"sampling_strategy": "alternating", "alternating_pattern": [0, 0, 2, 1]}
                    | common
                )
        out.append({"sampling_strategy": "sequential", "epoch_length_policy": pol, **fixed})
        out.append(
            {
                "sampling_strategy": "round_robin",
                "epoch_length_policy": pol,
                "cycle_short_loaders": False,
                **fixed,
            }
        )
    return out


def test_built_in_strategies_give_the_schedules_they_gave_before_the_registry():
    digest = hashlib.sha256()
    grid = _grid()
    for kwargs in grid:
        for epoch in range(3):
            sched = epoch_schedule(C(**kwargs), [5, 3, 2], epoch)
            digest.update(json.dumps([kwargs, epoch, sched.tolist()], sort_keys=True).encode())
    # computed by the code before the registry (schedule.py's branches on the strategy)
    assert len(grid) == 36
    assert digest.hexdigest() == "951635f1bac1403db6dc277ba7623e22b5d3139fa9fde7f217d4bf6f4113d14d"


class ReverseRoundRobin(BaseSampling):
    """Round robin from the last loader to the first."""

    name = "reverse_round_robin"

    def schedule(self, config, lengths, total, epoch):
        return cyclic(range(len(lengths) - 1, -1, -1), config.burst_size, total)


class HeaviestFirst(BaseSampling):
    """Every loader for its length, the loader of the largest weight first (uses weights)."""

    name = "heaviest_first"
    options = frozenset({"dataloader_weights"})

    def configure(self, config):
        if config.dataloader_weights is None:
            raise ValueError("heaviest_first needs dataloader_weights")
        return {"dataloader_weights": tuple(float(w) for w in config.dataloader_weights)}

    def schedule(self, config, lengths, total, epoch):
        order = np.argsort([-w for w in config.dataloader_weights], kind="stable")
        return np.repeat(order, np.asarray(lengths)[order])


@pytest.fixture
def user_strategies():
    register_sampling_strategy(ReverseRoundRobin())
    register_sampling_strategy(HeaviestFirst())
    yield
    unregister_sampling_strategy("reverse_round_robin")
    unregister_sampling_strategy("heaviest_first")
    assert "reverse_round_robin" not in sampling_strategies()


def lists(*lengths: int) -> list[list[str]]:
    return [[f"{'abcdefgh'[j]}{i}" for i in range(n)] for j, n in enumerate(lengths)]


def test_a_registered_strategy_is_used_by_multidataloader(user_strategies):
    config = C(sampling_strategy="reverse_round_robin", burst_size=2)
    assert config.sampling_strategy == "reverse_round_robin"
    assert config.to_dict()["sampling_strategy"] == "reverse_round_robin"
    steps = [(s.name, s.batch) for s in MultiDataLoader(lists(3, 3), config)]
    assert steps == [
        ("dl1", "b0"), ("dl1", "b1"), ("dl0", "a0"), ("dl0", "a1"),
        ("dl1", "b2"), ("dl1", "b0"),  # dl1 cycles: bursts of 2 from the last loader first
    ]  # fmt: skip
    heavy = C(sampling_strategy="heaviest_first", dataloader_weights=[1, 5])
    assert heavy.dataloader_weights == (1.0, 5.0)
    assert [s.batch for s in MultiDataLoader(lists(2, 1), heavy)] == ["b0", "a0", "a1"]


def test_options_a_user_strategy_reads_or_not_are_checked_by_name(user_strategies):
    with pytest.raises(
        ValueError,
        match=r"dataloader_weights would be unused: it applies to the WEIGHTED or "
        r"heaviest_first strategy only \(sampling_strategy is reverse_round_robin\)",
    ):
        C(sampling_strategy="reverse_round_robin", dataloader_weights=[1, 1])
    with pytest.raises(ValueError, match="heaviest_first needs dataloader_weights"):
        C(sampling_strategy="heaviest_first")
    with pytest.raises(
        ValueError,
        match=r"SamplingStrategy: unknown value 'random'; valid: SEQUENTIAL, ROUND_ROBIN, "
        r"WEIGHTED, ALTERNATING, heaviest_first, reverse_round_robin",
    ):
        C(sampling_strategy="random")
    with pytest.raises(ValueError, match="'reverse_round_robin' is already registered"):
        register_sampling_strategy(ReverseRoundRobin())
    with pytest.raises(TypeError, match="a sampling strategy needs name, label, options"):
        register_sampling_strategy(object())  # type: ignore[arg-type]


class Broken(BaseSampling):
    name = "broken"

    def schedule(self, config, lengths, total, epoch):
        return np.full(total, len(lengths))  # an index past the last loader


def test_a_schedule_out_of_range_is_an_error_naming_the_strategy():
    register_sampling_strategy(Broken())
    try:
        with pytest.raises(
            ValueError,
            match=r"sampling strategy 'broken' gave a schedule of shape \(4,\) \(int64\) for "
            r"epoch 0; expected 4 loader indices in \[0, 2\)",
        ):
            list(MultiDataLoader(lists(2, 2), C(sampling_strategy="broken")))
    finally:
        unregister_sampling_strategy("broken")


def test_a_replaced_built_in_is_used_and_unregistering_restores_it():
    builtin = get_sampling_strategy("round_robin")
    register_sampling_strategy(type("RR", (ReverseRoundRobin,), {"name": "round_robin"})(),
                               replace=True)  # fmt: skip
    try:
        assert C().sampling_strategy is SamplingStrategy.ROUND_ROBIN
        assert [s.batch for s in MultiDataLoader(lists(1, 1))] == ["b0", "a0"]
    finally:
        unregister_sampling_strategy("round_robin")
    assert get_sampling_strategy("round_robin") is builtin
    assert [s.batch for s in MultiDataLoader(lists(1, 1))] == ["a0", "b0"]


# ---------------------------------------------------------------------------------- state

# What MultiDataLoader.state_dict() returned before its state was a typed record (commit
# 09d9d40^, the dict built by hand): WEIGHTED, seeded, bursts of 2, epoch 3, 7 of 9 steps done.
OLD_STATE = {
    "format": "wdsloader.mix.multi",
    "version": 1,
    "config": {
        "sampling_strategy": "weighted",
        "dataloader_weights": [2.0, 1.0],
        "alternating_pattern": None,
        "dataloader_names": ["big", "small"],
        "epoch_length_policy": "fixed_num_steps",
        "steps_per_epoch": 9,
        "cycle_short_loaders": True,
        "burst_size": 2,
        "choice_rng_seed": 7,
    },
    "lengths": [4, 2],
    "epoch": 3,
    "position": 7,
    "loaders": [
        {"name": "big", "batches": 4, "cycles": 0, "exhausted": False, "state": None},
        {"name": "small", "batches": 1, "cycles": 1, "exhausted": False, "state": None},
    ],
}
OLD_CONFIG = C(
    sampling_strategy="weighted", dataloader_weights=[2, 1], choice_rng_seed=7, burst_size=2,
    dataloader_names=["big", "small"], epoch_length_policy="fixed_num_steps", steps_per_epoch=9,
)  # fmt: skip
# the old code's whole epoch 3: ['b0', 'b1', 'a0', 'a1', 'a2', 'a3', 'b0', 'a0', 'a1']


def test_a_state_saved_by_the_old_untyped_code_loads_and_resumes():
    mdl = MultiDataLoader(lists(4, 2), OLD_CONFIG)
    mdl.load_state_dict(copy.deepcopy(OLD_STATE))
    assert mdl.state_dict() == OLD_STATE
    assert [s.batch for s in mdl] == ["a0", "a1"]  # what the old code yielded after step 7
    assert mdl.epoch == 4


def test_the_typed_state_of_a_user_strategy_round_trips_and_resumes(user_strategies):
    config = C(sampling_strategy="reverse_round_robin", dataloader_names=["x", "y"])
    full = [s.batch for s in MultiDataLoader(lists(3, 2), config)]
    first = MultiDataLoader(lists(3, 2), config)
    it = iter(first)
    head = [next(it).batch for _ in range(3)]
    state = first.state()
    assert isinstance(state, MultiState)
    assert MultiState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    with pytest.raises(AttributeError):
        state.position = 0  # type: ignore[misc]
    second = MultiDataLoader(lists(3, 2), config)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + [s.batch for s in second] == full


def test_a_tampered_state_is_a_clear_error(user_strategies):
    config = C(sampling_strategy="reverse_round_robin")
    mdl = MultiDataLoader(lists(2, 2), config)
    it = iter(mdl)
    next(it)
    saved = mdl.state_dict()
    other = copy.deepcopy(saved)
    other["config"]["sampling_strategy"] = "round_robin"
    with pytest.raises(
        StateMismatchError,
        match=r"the MultiDataLoader config differs \(sampling_strategy: saved 'round_robin', "
        r"now 'reverse_round_robin'\)",
    ):
        MultiDataLoader(lists(2, 2), config).load_state_dict(other)
    other = copy.deepcopy(saved)
    other["version"] = 2
    with pytest.raises(StateMismatchError, match="MultiDataLoader state version 2 is not 1"):
        MultiDataLoader(lists(2, 2), config).load_state_dict(other)
    with pytest.raises(StateMismatchError, match="config differs"):
        MultiDataLoader(lists(2, 2)).load_state_dict(saved)  # saved under another strategy
