"""Loader states: refused when taken on other shards or another plan, or when damaged, with a
message that names the part; older states without the shards digest still load."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging

import pytest

from tests.dataset_factory import SCHEMA, sample_members, write_dataset, write_split
from wdsloader import StateMismatchError, WdsLoaderError, create_loader
from wdsloader.collate import DefaultCollator
from wdsloader.format import Manifest
from wdsloader.stream import fingerprint as fingerprint_module
from wdsloader.stream.state import LoaderState

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


def _keys_only(samples):
    """A collator of its own (module level: picklable)."""
    return DefaultCollator()(samples)


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


def test_a_seed_the_loader_takes_is_one_its_state_loads(two_datasets):
    # a seed derived from a sha256 digest (256 bits) was taken, iterated and saved, and the
    # state then refused as out of bounds (from 0 to 2**128): one bound, where the seed enters
    a, _ = two_datasets
    seed = int(hashlib.sha256(b"run-42").hexdigest(), 16)
    assert seed > 2**128
    full = [b["__key__"] for b in loader(a, seed=seed)]
    resumed = loader(a, seed=seed)
    resumed.load_state_dict(json.loads(json.dumps(state_after(a, 2, seed=seed))))
    assert [b["__key__"] for b in resumed] == full[2:]
    with pytest.raises(ValueError, match=r"^seed must be <= 2\*\*256 - 1, got a 257-bit int$"):
        loader(a, seed=2**256)


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
        (lambda s: s["resume"].update(world_size=0), r"resume\.'world_size' = 0 is out of bounds"),
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


# A state dict saved by wdsloader before the stage fingerprint (main at fb85360), over the
# factory dataset: 2 batches of 4 done, drop_last=False.
SAVED_BEFORE_FINGERPRINT = {
    "format": "wdsloader.stream.loader",
    "version": 1,
    "split": "train",
    "epoch": 0,
    "batches_done": 2,
    "resume": {
        "batches_done": 2,
        "world_size": 1,
        "num_workers": 1,
        "batch_size": 4,
        "drop_last": False,
        "window": 16384,
        "prior": None,
    },
    "seed": 0,
    "shuffle": True,
    "span": 1,
    "num_samples": 24,
    "counts_digest": "17b9204e185f2e1e",
    "shards_digest": "8005a28c9c3ee6bb",
}
# ... and one of an elastic resume (2 ranks of batch 4, then 1 rank of batch 3 with 2 workers).
SAVED_ELASTIC_BEFORE_FINGERPRINT = {
    **SAVED_BEFORE_FINGERPRINT,
    "batches_done": 1,
    "resume": {
        "batches_done": 1,
        "world_size": 1,
        "num_workers": 2,
        "batch_size": 3,
        "drop_last": True,
        "window": 16386,
        "prior": {**SAVED_BEFORE_FINGERPRINT["resume"], "batches_done": 1, "world_size": 2},
    },
}


def keys(batches):
    return [b["__key__"] for b in batches]


def test_state_saved_before_the_fingerprint_is_refused_as_the_old_plan(two_datasets):
    """A state without a fingerprint was saved by plan version 1: its batches_done stands on
    other samples under the current plan, so it is refused, not replayed."""
    a, _ = two_datasets
    for saved in (SAVED_BEFORE_FINGERPRINT, SAVED_ELASTIC_BEFORE_FINGERPRINT):
        with pytest.raises(
            StateMismatchError,
            match=r"the plan version differs: the loader state was saved by plan "
            r"'span-permutation/1' and this wdsloader plans with 'span-feistel/2'",
        ):
            loader(a, drop_last=False).load_state_dict(copy.deepcopy(saved))


def test_state_object_round_trips_and_is_frozen(two_datasets):
    a, _ = two_datasets
    ld = loader(a)
    it = iter(ld)
    next(it)
    state = ld.state()
    assert isinstance(state, LoaderState)
    data = state.to_dict()
    assert json.loads(json.dumps(data)) == data == ld.state_dict()
    assert LoaderState.from_dict(data) == state
    assert (state.epoch, state.batches_done, data["fingerprint"]["plan"]) == (
        0,
        1,
        "span-feistel/2",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.epoch = 3  # type: ignore[misc]
    resumed = loader(a)
    resumed.load_state_dict(state)  # the object itself is accepted too
    assert keys(resumed) == keys(loader(a))[1:]


@pytest.mark.parametrize(
    ("saved", "now", "message"),
    [
        (
            {"fields": ["vec", "idx"]},
            {},
            r"differs: fields saved='idx,vec' now='idx,meta,vec'$",
        ),
        ({}, {"allow_pickle": True}, r"differs: decoder saved='allow_pickle=False' now="),
        ({"collate_fn": "default"}, {"collate_fn": _keys_only}, r"differs: collate saved="),
    ],
)
def test_state_from_another_stage_config_is_refused(two_datasets, saved, now, message):
    a, _ = two_datasets
    state = state_after(a, 1, **saved)
    with pytest.raises(StateMismatchError, match=message):
        loader(a, **now).load_state_dict(state)


def test_state_from_another_plan_version_is_refused(two_datasets, monkeypatch):
    a, _ = two_datasets
    state = state_after(a, 1)
    old = copy.deepcopy(state)
    old["fingerprint"]["plan"] = "span-permutation/1"  # what the plan before version 2 saved
    with pytest.raises(
        StateMismatchError,
        match=r"plan version differs: .* saved by plan 'span-permutation/1' and this wdsloader "
        r"plans with 'span-feistel/2'",
    ):
        loader(a).load_state_dict(old)
    monkeypatch.setattr(fingerprint_module, "PLAN_ALGORITHM", ("span-feistel", 3))
    with pytest.raises(StateMismatchError, match=r"plans with 'span-feistel/3'"):
        loader(a).load_state_dict(state)


def test_malformed_fingerprint_is_a_clear_error(two_datasets):
    a, _ = two_datasets
    state = copy.deepcopy(state_after(a, 1))
    state["fingerprint"]["fields"] = 3
    with pytest.raises(StateMismatchError, match=r"'fingerprint\.fields' should be str, got int"):
        loader(a).load_state_dict(state)
    state["fingerprint"] = "x"
    with pytest.raises(StateMismatchError, match=r"'fingerprint' should be dict, got str"):
        loader(a).load_state_dict(state)


def _deep_prior(state, depth):
    """``state`` whose resume has ``depth`` priors (alternating batch sizes 3 and 4)."""
    link = None
    for i in range(depth):
        link = {**state["resume"], "batch_size": 3 + i % 2, "batches_done": 0, "prior": link}
    state["resume"] = {**state["resume"], "batch_size": 5, "prior": link}
    return state


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda s: s["resume"].update(num_workers=10**12),
            r"resume\.'num_workers' = 1000000000000 is out of bounds \(from 1 to 65536\)",
        ),
        (
            lambda s: s["resume"].update(batch_size=2**70),
            r"resume\.'batch_size' = 1180591620717411303424 is out of bounds",
        ),
        (
            lambda s: s.update(epoch=2**64),
            r"'epoch' = 18446744073709551616 is out of bounds \(from 0 to 4611686018427387904\)",
        ),
        (lambda s: s.update(epoch=-1), r"'epoch' = -1 is out of bounds"),
        (lambda s: s.update(num_samples=2**63), r"'num_samples' = 9223372036854775808 is out"),
        (lambda s: s.update(span=10**400), r"'span' = 1329 bits is out of bounds"),
        (
            lambda s: s["resume"].update(world_size=2**14, num_workers=2**11),
            r"resume\.'world_size' \* resume\.'num_workers' = 33554432 is above the bound 16777216",
        ),
        (
            lambda s: _deep_prior(s, 5000),
            r"'resume' is a chain of more than 256 elastic resumes within one epoch",
        ),
        (
            lambda s: s.update(batches_done=7),
            r"'batches_done' = 7 and 'resume\.batches_done' = 2 should be equal",
        ),
    ],
)
def test_tampered_numbers_are_refused_naming_the_key(two_datasets, damage, message):
    a, _ = two_datasets
    state = copy.deepcopy(state_after(a, 2))
    damage(state)
    with pytest.raises(StateMismatchError, match=message):
        loader(a).load_state_dict(state)


def test_a_tampered_state_object_is_refused_and_a_long_real_chain_loads(two_datasets):
    a, _ = two_datasets
    state = loader(a).state()
    resume = dataclasses.replace(state.resume, num_workers=10**12)
    with pytest.raises(StateMismatchError, match=r"resume\.'num_workers' = 10{12} is out of"):
        loader(a).load_state_dict(dataclasses.replace(state, resume=resume))
    chained = _deep_prior(copy.deepcopy(state_after(a, 0)), 255)  # the longest chain accepted
    assert len(LoaderState.from_dict(chained).resume.chain()) == 256
    assert LoaderState.from_dict(chained).to_dict() == chained


def test_a_state_at_the_longest_chain_resumes_on_its_topology_only(two_datasets):
    # resumed on another topology, the next state_dict() would hold 257 elastic resumes, a
    # state the loader itself refuses: refused at load naming the topology to resume on
    a, _ = two_datasets
    head = create_loader(a, "train", batch_size=5, num_workers=0)
    it = iter(head)
    next(it)
    state = _deep_prior(json.loads(json.dumps(head.state_dict())), 255)
    with pytest.raises(
        StateMismatchError,
        match=r"the loader state holds 256 elastic resumes within epoch 0, the most a state "
        r"may hold: resume it with world_size=1, num_workers=1, batch_size=5, drop_last=True, "
        r"window=\d+ \(now batch_size=4, window=\d+\), or start the next epoch without it",
    ):
        loader(a).load_state_dict(state)
    same = create_loader(a, "train", batch_size=5, num_workers=0)
    same.load_state_dict(state)
    it = iter(same)
    next(it)
    again = create_loader(a, "train", batch_size=5, num_workers=0)
    again.load_state_dict(same.state_dict())  # what it saves loads
