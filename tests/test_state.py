"""Loader states: refused when taken on other shards or another plan, or when damaged, with a
message that names the part; older states without the shards digest still load."""

from __future__ import annotations

import copy
import logging

import pytest

from tests.dataset_factory import SCHEMA, sample_members, write_dataset, write_split
from wdsloader import StateMismatchError, WdsLoaderError, create_loader
from wdsloader.format import Manifest

COUNTS = [9, 7, 8]


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    """The factory dataset, and one with the same shard counts but other samples."""
    base = tmp_path_factory.mktemp("state")
    a, b = str(base / "a"), str(base / "b")
    write_dataset(a, {"train": COUNTS})
    other = Manifest(schema=dict(SCHEMA), dims={"D": 4}, build={"seed": 0})
    other.splits["train"] = write_split(
        b, "train", COUNTS, lambda i, s: (f"other{i:07d}", sample_members(i + 100, s))
    )
    other.save(b)
    return a, b


def loader(root, **kw):
    return create_loader(root, "train", batch_size=4, num_workers=0, **kw)


def state_after(root, k, **kw):
    ld = loader(root, **kw)
    it = iter(ld)
    for _ in range(k):
        next(it)
    return ld.state_dict()


def test_state_from_other_shards_with_the_same_counts_is_refused(two_datasets):
    a, b = two_datasets
    state = state_after(a, 2)
    with pytest.raises(StateMismatchError, match=r"differs: shards: paths or sha256"):
        loader(b).load_state_dict(state)
    loader(a).load_state_dict(state)  # its own dataset accepts it


def test_mismatch_names_the_part_that_differs(two_datasets):
    a, _ = two_datasets
    state = state_after(a, 1, seed=1)
    with pytest.raises(StateMismatchError, match=r"differs: seed saved=1 now=0$"):
        loader(a).load_state_dict(state)
    val = create_loader(a, "train", batch_size=4, shuffle=False, seed=1)
    with pytest.raises(StateMismatchError, match=r"differs: shuffle saved=True now=False"):
        val.load_state_dict(state)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s: s.pop("epoch"), r"key 'epoch' is missing"),
        (lambda s: s.update(resume=None), r"'resume' should be dict, got None"),
        (lambda s: s.update(epoch="2"), r"'epoch' should be int, got str"),
        (lambda s: s.update(shuffle=1), r"'shuffle' should be bool, got int"),
        (lambda s: s["resume"].pop("world_size"), r"key resume\.'world_size' is missing"),
        (lambda s: s["resume"].update(batches_done=1.5), r"resume\.'batches_done' should be"),
        (lambda s: s["resume"].update(prior=[1]), r"'resume\.prior' should be dict, got list"),
        (lambda s: s["resume"].update(world_size=0), r"resume point is invalid: world_size"),
        (lambda s: s.update(format="other"), r"not a wdsloader loader state"),
    ],
)
def test_damaged_state_is_a_clear_error(two_datasets, damage, message):
    a, _ = two_datasets
    state = copy.deepcopy(state_after(a, 2))
    damage(state)
    with pytest.raises(StateMismatchError, match=message):
        loader(a).load_state_dict(state)


def test_state_that_is_not_a_dict_is_refused(two_datasets):
    a, _ = two_datasets
    with pytest.raises(StateMismatchError, match="a loader state is a dict.*got None"):
        loader(a).load_state_dict(None)
    assert issubclass(StateMismatchError, WdsLoaderError)
    assert issubclass(StateMismatchError, ValueError)


def test_state_saved_before_the_shards_digest_loads_with_a_warning(two_datasets, caplog):
    a, _ = two_datasets
    full = [b["__key__"] for b in loader(a)]
    state = state_after(a, 2)
    del state["shards_digest"]
    caplog.set_level(logging.WARNING, logger="wdsloader.stream.state")
    resumed = loader(a)
    resumed.load_state_dict(state)
    assert "no shards digest" in caplog.text
    assert [b["__key__"] for b in resumed] == full[2:]
