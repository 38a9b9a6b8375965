"""MultiDataLoader: a damaged state is refused at load_state_dict naming the key (not a skip of
the epoch's rest or a failure at the first step), and a loader of length 0 that the schedule
gives steps is a ValueError naming it before any step (not a RuntimeError mid-epoch)."""

from __future__ import annotations

import copy
import json

import pytest

from wdsloader.errors import StateMismatchError
from wdsloader.mix import EpochLengthPolicy, MultiDataLoader, MultiDataLoaderConfig
from wdsloader.mix import SamplingStrategy as S
from wdsloader.mix.multi_state import MultiState

C = MultiDataLoaderConfig


def lists(*lengths: int) -> list[list[str]]:
    return [[f"{'abcdefgh'[j]}{i}" for i in range(n)] for j, n in enumerate(lengths)]


def _state_after(steps: int) -> dict:
    mdl = MultiDataLoader(lists(2, 2))  # round robin: a0 b0 a1 b1
    it = iter(mdl)
    for _ in range(steps):
        next(it)
    return copy.deepcopy(mdl.state_dict())


def _rows(s: dict) -> list:
    return s["loaders"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda s: s.update(position=99),
            r"'position' = 99 is past the 4 steps of epoch 0's schedule",
        ),
        (lambda s: s.pop("config"), r"key 'config' is missing"),
        (lambda s: s.pop("lengths"), r"key 'lengths' is missing"),
        (lambda s: s.pop("loaders"), r"key 'loaders' is missing"),
        (lambda s: _rows(s)[0].pop("batches"), r"key loaders\[0\]\.'batches' is missing"),
        (lambda s: _rows(s)[1].pop("state"), r"key loaders\[1\]\.'state' is missing"),
        (lambda s: s.update(loaders={"dl0": {}, "dl1": {}}), r"'loaders' should be list, got dict"),
        (lambda s: _rows(s).__setitem__(0, "dl0"), r"'loaders\[0\]' should be dict, got str"),
        (lambda s: _rows(s)[0].update(cycles=-1), r"loaders\[0\]\.'cycles' = -1 is out of bounds"),
        (lambda s: _rows(s)[1].update(exhausted=1), r"loaders\[1\]\.'exhausted' should be bool"),
        (lambda s: s.update(epoch=2**64), r"'epoch' = 18446744073709551616 is out of bounds"),
        (lambda s: s.update(position=True), r"'position' should be int, got bool"),
        (lambda s: s.update(lengths=[2, "2"]), r"'lengths\[1\]' should be int or None, got str"),
        (lambda s: s.update(lengths=[2, 2, 2]), r"'loaders' has 2 entries and 'lengths' 3"),
        (
            lambda s: _rows(s)[1].update(batches=2),
            r"'loaders\[1\]\.batches' = 2 but the schedule gave loader 'dl1' 1 of the 3 steps "
            r"before 'position'",
        ),
        (
            lambda s: _rows(s)[0].update(exhausted=True),
            r"'loaders\[0\]\.exhausted' is true but cycle_short_loaders is on",
        ),
    ],
)
def test_a_damaged_state_is_refused_naming_the_key(damage, message):
    state = _state_after(3)
    damage(state)
    mdl = MultiDataLoader(lists(2, 2))
    with pytest.raises(StateMismatchError, match=message):
        mdl.load_state_dict(state)
    assert mdl.state_dict() == _state_after(0)  # nothing of it was taken


def test_the_state_record_round_trips_and_resumes():
    full = [s.batch for s in MultiDataLoader(lists(2, 3))]
    first = MultiDataLoader(lists(2, 3))
    it = iter(first)
    head = [next(it).batch for _ in range(3)]
    record = first.state()
    assert isinstance(record, MultiState) and (record.epoch, record.position) == (0, 3)
    data = json.loads(json.dumps(first.state_dict()))
    assert MultiState.from_dict(data) == record and record.to_dict() == data
    for saved in (data, record):
        again = MultiDataLoader(lists(2, 3))
        again.load_state_dict(saved)
        assert again.state() == record  # a loaded state not yet started is the state
        assert head + [s.batch for s in again] == full


@pytest.mark.parametrize(
    "config",
    [
        C(sampling_strategy=S.WEIGHTED, dataloader_weights=[2, 1, 1]),
        C(sampling_strategy=S.ROUND_ROBIN),
        C(sampling_strategy=S.ALTERNATING, alternating_pattern=[0, 1, 2]),
    ],
    ids=["weighted", "round_robin", "alternating"],
)
def test_an_empty_loader_with_steps_is_a_value_error_at_construction(config):
    names = C(**{**_kwargs(config), "dataloader_names": ["web", "empty", "code"]})
    with pytest.raises(
        ValueError,
        match=rf"MultiDataLoader: loaders with len\(\) 0 get steps of epoch 0 \(\d+ steps, "
        rf"{names.sampling_strategy.name}\): 'empty' \(\d+ steps\); leave them out",
    ):
        MultiDataLoader([["a0", "a1"], [], ["c0", "c1"]], names)


def _kwargs(config: MultiDataLoaderConfig) -> dict:
    return {
        k: getattr(config, k)
        for k in ("sampling_strategy", "dataloader_weights", "alternating_pattern")
    }


def test_an_empty_loader_without_steps_or_without_cycling_is_accepted():
    seq = MultiDataLoader([["a0"], [], ["c0"]], C(sampling_strategy=S.SEQUENTIAL))
    assert [s.batch for s in seq] == ["a0", "c0"]
    no_cycle = MultiDataLoader([["a0", "a1"], [], ["c0"]], C(cycle_short_loaders=False))
    assert [s.batch for s in no_cycle] == ["a0", "c0"]  # its slot of the 3 is left out


def test_a_loader_that_becomes_empty_is_refused_before_the_epoch_s_first_step():
    class Shrinking(list):
        pass

    shrinking = Shrinking(["b0"])
    mdl = MultiDataLoader(
        [["a0", "a1"], shrinking],
        C(epoch_length_policy=EpochLengthPolicy.FIXED_NUM_STEPS, steps_per_epoch=4),
    )
    assert [s.batch for s in mdl] == ["a0", "b0", "a1", "b0"]
    shrinking.clear()
    it = iter(mdl)
    with pytest.raises(ValueError, match=r"'dl1' \(2 steps\)"):
        next(it)
