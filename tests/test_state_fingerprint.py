"""A loader state records what the user functions of a loader do where the resume depends on
them: a mix's weights function (the quotas of the saved epoch and of the epochs before it) and a
curriculum's schedule function (its probabilities at the saved epoch). The same function name
returning other values there is refused, naming the part; the same values resume exactly."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.dataset_factory import write_dataset
from tests.test_curriculum_loader import VARIANTS, write_curriculum_dataset
from wdsloader import Curriculum, create_loader
from wdsloader.curriculum import from_callable
from wdsloader.errors import StateMismatchError
from wdsloader.mix import MixSource


class Rule:
    """Weights of sources ``a``/``b``: ``a`` gets ``share`` (``late`` from epoch 5 on)."""

    def __init__(self, share: float, late: float | None = None) -> None:
        self.share, self.late = share, late

    def __call__(self, epoch: int) -> dict[str, float]:
        a = self.late if self.late is not None and epoch >= 5 else self.share
        return {"a": a, "b": 1.0 - a}


class ZeroRule:
    """Curriculum probabilities: ``zero`` gets ``p``, the variants share the rest."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, epoch: int) -> dict[str, float]:
        rest = (1.0 - self.p) / 3
        return {"zero": self.p, "a": rest, "b": rest, "c": rest}


@pytest.fixture(scope="module")
def mix_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixfp")
    for name in ("a", "b"):
        write_dataset(str(root / name), {"train": [60, 40]})
    return root


def _mix(root: Path, rule: Rule):
    sources = [MixSource(root / "a"), MixSource(root / "b")]
    return create_loader(
        sources, "train", 8, weights=from_callable(rule), epoch_samples=80, seed=3,
        source_field="__source__", num_workers=0,
    )  # fmt: skip


def _keys(batches) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


def _state_in_epoch_1(loader, steps: int = 3) -> dict:
    list(loader)  # epoch 0
    it = iter(loader)
    for _ in range(steps):
        next(it)
    return copy.deepcopy(loader.state_dict())


def test_a_changed_weights_function_of_the_same_name_is_refused(mix_data):
    state = _state_in_epoch_1(_mix(mix_data, Rule(0.9)))
    assert state["fingerprint"]["mix_weights"].startswith("epoch 1:")
    with pytest.raises(
        StateMismatchError,
        match=r"differs: the mix's weights function \(the quotas it gives the saved epoch and "
        r"the epochs before it\) \(mix_weights\) saved='epoch 1:\w+' now='epoch 1:\w+'$",
    ):
        _mix(mix_data, Rule(0.1)).load_state_dict(state)


def test_the_same_weights_up_to_the_saved_epoch_resume_exactly(mix_data):
    full = _mix(mix_data, Rule(0.9))
    list(full)
    rest = _keys(full)
    state = _state_in_epoch_1(_mix(mix_data, Rule(0.9)))
    # another instance, and one that differs only after the saved epoch: both accepted
    for rule in (Rule(0.9), Rule(0.9, late=0.2)):
        again = _mix(mix_data, rule)
        again.load_state_dict(state)
        assert _keys(again) == rest[3:]


def test_a_state_without_the_weights_part_is_refused(mix_data):
    """A state saved before the part was recorded cannot be compared: refused, not trusted."""
    state = _state_in_epoch_1(_mix(mix_data, Rule(0.9)))
    del state["fingerprint"]["mix_weights"]
    with pytest.raises(StateMismatchError, match=r"\(mix_weights\) saved=None now='epoch 1:"):
        _mix(mix_data, Rule(0.9)).load_state_dict(state)


@pytest.fixture(scope="module")
def curr_data(tmp_path_factory) -> str:
    return write_curriculum_dataset(tmp_path_factory.mktemp("currfp") / "ds", [30, 26])


def _curr(root: str, p: float):
    curriculum = Curriculum(VARIANTS, schedule=from_callable(ZeroRule(p)), seed=7)
    return create_loader(root, "train", 8, curriculum=curriculum, num_workers=0, drop_last=False)


def test_a_changed_curriculum_schedule_function_of_the_same_name_is_refused(curr_data):
    saved = _curr(curr_data, 0.5)
    full = [(b["__key__"], b["steering"].tolist()) for b in _curr(curr_data, 0.5)]
    next(iter(saved))
    state = saved.state_dict()
    with pytest.raises(
        StateMismatchError,
        match=r"differs: the curriculum's schedule function \(its probabilities at the saved "
        r"epoch\) \(curriculum_schedule\) saved='epoch 0:\w+' now='epoch 0:\w+'$",
    ):
        _curr(curr_data, 0.2).load_state_dict(state)
    same = _curr(curr_data, 0.5)
    same.load_state_dict(state)
    assert [(b["__key__"], b["steering"].tolist()) for b in same] == full[1:]
