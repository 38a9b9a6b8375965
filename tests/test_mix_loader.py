"""Sources mixed inside one stream, through the real loader: three sources of very different sizes
(40, 400 and 4000 samples) with exact per-epoch quotas on every rank and worker count, resume
across epochs and weight changes, set_epoch in persistent workers, the source field and stats,
and the errors (schemas that disagree, a state from another mix, mix options without a mix)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.dataset_factory import SCHEMA, npy_bytes, write_dataset, write_split
from wdsloader import create_loader
from wdsloader.curriculum import linear
from wdsloader.errors import StateMismatchError
from wdsloader.format import FieldSpec, Manifest
from wdsloader.mix import MixSource

SIZES = {"small": [40], "mid": [150, 250], "big": [1000, 1000, 1000, 1000]}
BATCH = 10


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixdata")
    for name, counts in SIZES.items():
        write_dataset(str(root / name), {"train": counts})
    return root


def _sources(data: Path) -> list[MixSource]:
    # small: 100 a epoch (2.5 passes), mid: once, big: the 1000 the epoch leaves (a quarter)
    return [
        MixSource(data / "small", samples=100),
        MixSource(data / "mid", repeat=1),
        MixSource(data / "big", weight=1.0),
    ]


def _loader(data: Path, sources=None, **kw):
    opts = {"seed": 7, "source_field": "__source__", "epoch_samples": 1500, "shuffle_window": 40}
    opts.update(kw)
    return create_loader(sources or _sources(data), "train", BATCH, **opts)


def _batch(b) -> list[tuple[int, int]]:
    return list(zip(b["__source__"].tolist(), b["idx"].tolist(), strict=True))


def _play(loader, epochs: int, stop: tuple[int, int] | None = None) -> dict:
    """Per epoch the (source, idx) batches; with ``stop=(epoch, step)`` also the state there."""
    seen: dict[int, list] = {}
    while loader.dataset_obj.epoch < epochs:
        epoch = loader.dataset_obj.epoch
        seen[epoch] = []
        for b in loader:
            seen[epoch].append(_batch(b))
            if stop == (epoch, len(seen[epoch])):
                return {"seen": seen, "state": json.loads(json.dumps(loader.state_dict()))}
    return {"seen": seen}


@pytest.mark.parametrize("workers", [0, 2])
def test_three_sources_exact_quotas_on_every_rank_and_no_repeat_before_exhaustion(data, workers):
    extra = {"persistent_workers": True} if workers else {}
    loaders = [_loader(data, rank=r, world_size=2, num_workers=workers, **extra) for r in range(2)]
    assert [len(ld) for ld in loaders] == [75, 75]  # 1500 / (2 ranks x 10)
    runs = [_play(ld, 4)["seen"] for ld in loaders]
    big_order: list[int] = []
    small_total: Counter = Counter()
    for epoch in range(4):
        assert [len(r[epoch]) for r in runs] == [75, 75]  # every rank the same batches
        assert all(len(b) == BATCH for r in runs for b in r[epoch])
        both = Counter(x for r in runs for b in r[epoch] for x in b)
        per_source = Counter()
        for (src, _), n in both.items():
            per_source[src] += n
        assert per_source == {0: 100, 1: 400, 2: 1000}  # exactly the quotas
        assert sorted(i for (s, i), n in both.items() if s == 1 for _ in range(n)) == list(
            range(400)
        )  # mid: each sample once
        small = Counter({i: n for (s, i), n in both.items() if s == 0})
        assert set(small.values()) <= {2, 3}  # 100 of 40: each 2 or 3 times
        small_total += small
        big = [i for (s, i), n in both.items() if s == 2 for _ in range(n)]
        assert len(set(big)) == 1000  # a subsample without replacement
        big_order += big
        mixed = sum(len({s for s, _ in b}) > 1 for r in runs for b in r[epoch])
        assert mixed >= 100  # batches mix the sources
    # big: 4 epochs of a quarter each saw all 4000 samples once before any twice
    assert sorted(big_order) == list(range(4000))
    # small: 400 samples over 4 epochs: each of the 40 exactly 10 times
    assert set(small_total.values()) == {10}
    stats = [ld.stats for ld in loaders]
    assert [stats[0]["samples"], stats[1]["samples"]] == [3000, 3000]  # 4 epochs x 75 x 10
    per_source = [sum(st[f"samples/{n}"] for st in stats) for n in ("small", "mid", "big")]
    assert per_source == [400, 1600, 4000]  # the quotas of 4 epochs, over both ranks


def test_the_source_field_is_off_by_default_and_stats_count_per_source(data):
    loader = create_loader(_sources(data), "train", BATCH, epoch_samples=1500, seed=1)
    first = next(iter(loader))
    # no named source field; the provenance fields name each sample's source and position
    assert set(first) == {"__key__", "__index__", "__source__", "idx", "vec", "meta"}
    named = _loader(data, source_field="origin")
    b = next(iter(named))
    assert b["origin"].dtype.is_floating_point is False
    assert b["origin"].tolist() == b["__source__"].tolist()


def _weights_schedule():
    return linear({"mid": 0.5, "big": 0.5}, {"mid": 0.1, "big": 0.9}, epochs=2)


@pytest.mark.parametrize("stop", [(0, 75), (0, 31), (1, 7), (2, 40)])
def test_resume_across_epochs_and_weight_changes_equals_the_uninterrupted_run(data, stop):
    def make():
        srcs = [
            MixSource(data / "small", repeat=2.5),
            MixSource(data / "mid"),
            MixSource(data / "big"),
        ]
        return _loader(data, srcs, weights=_weights_schedule(), epoch_samples=1100, num_workers=0)

    full = _play(make(), 3)["seen"]
    # weights moved from 0.5/0.5 to 0.1/0.9 of the 1000 left after small's 100
    counts = [Counter(s for b in full[e] for s, _ in b) for e in range(3)]
    assert counts == [{0: 100, 1: 500, 2: 500}, {0: 100, 1: 300, 2: 700}, {0: 100, 1: 100, 2: 900}]
    first = _play(make(), 3, stop=stop)
    again = make()
    again.load_state_dict(first["state"])
    rest = _play(again, 3)["seen"]
    epoch, step = stop
    joined = {e: first["seen"].get(e, []) for e in range(3)}
    for e, batches in rest.items():
        joined[e] = (joined[e] if e == epoch else []) + batches
    assert joined == full


def test_elastic_resume_on_another_world_size_delivers_the_rest_of_the_epoch_once(data):
    ranks = [_loader(data, rank=r, world_size=2, num_workers=2) for r in range(2)]
    heads = [_play(ld, 1, stop=(0, 20)) for ld in ranks]
    one = _loader(data, num_workers=1)
    one.load_state_dict(heads[0]["state"])
    rest = _play(one, 1)["seen"][0]
    got = Counter(x for h in heads for b in h["seen"][0] for x in b)
    got.update(x for b in rest for x in b)
    full = [_play(_loader(data, rank=r, world_size=2, num_workers=2), 1)["seen"][0] for r in (0, 1)]
    assert got == Counter(x for run in full for b in run for x in b)
    assert len(rest) == 110  # (1500 - 2 x 20 x 10) / 10


def test_set_epoch_reaches_persistent_workers(data):
    loader = _loader(data, num_workers=2, persistent_workers=True)
    _play(loader, 1)
    loader.set_epoch(3)
    third = [_batch(b) for b in loader]
    fresh = [_batch(b) for b in _loader(data, num_workers=2, epoch=3)]
    assert third == fresh
    assert third != [_batch(b) for b in _loader(data, num_workers=2, epoch=2)]


def test_stratified_batches_hold_each_sources_exact_share(data):
    srcs = [MixSource(data / n, weight=w) for n, w in (("small", 0.1), ("mid", 0.3), ("big", 0.6))]
    loader = _loader(data, srcs, batching="stratified", epoch_samples=2000)
    batches = [Counter(b["__source__"].tolist()) for b in loader]
    assert len(batches) == 200 and all(c == {0: 1, 1: 3, 2: 6} for c in batches)


def _write_wide(root: Path) -> None:
    """A dataset like the factory's, but with ``vec`` of D=8 floats."""
    schema = dict(SCHEMA)
    manifest = Manifest(schema=schema, dims={"D": 8})

    def make(i: int, s: int):
        members = [("vec.npy", npy_bytes(np.zeros(8, np.float32))), ("idx.cls", str(i).encode()),
                   ("meta.json", json.dumps({"i": i}).encode())]  # fmt: skip
        return f"train{i:07d}", members

    manifest.splits["train"] = write_split(str(root), "train", [12], make)
    manifest.save(str(root))


def test_sources_whose_schemas_disagree_are_an_error_naming_both_specs(data, tmp_path):
    _write_wide(tmp_path / "wide")
    srcs = [MixSource(data / "small", weight=1), MixSource(tmp_path / "wide", weight=1)]
    with pytest.raises(
        ValueError,
        match=r"sources 'small' and 'wide' disagree on field 'vec': small: ext='vec.npy', "
        r"encoding='npy', dtype='float32', shape=\['D'\], D=4; wide: .*shape=\['D'\], D=8",
    ):
        create_loader(srcs, "train", 4)
    loader = create_loader(srcs, "train", 4, fields=["idx", "meta"], source_field="src")
    b = next(iter(loader))
    assert set(b) == {"__key__", "__index__", "__source__", "idx", "meta", "src"}


def test_a_field_missing_from_a_source_is_an_error(data, tmp_path):
    schema = {"idx": FieldSpec(ext="idx.cls", encoding="cls", dtype="int64", shape=[])}
    manifest = Manifest(schema=schema)
    manifest.splits["train"] = write_split(
        str(tmp_path / "bare"), "train", [5], lambda i, s: (f"k{i}", [("idx.cls", b"1")])
    )
    manifest.save(str(tmp_path / "bare"))
    srcs = [MixSource(data / "small", weight=1), MixSource(tmp_path / "bare", weight=1)]
    with pytest.raises(
        ValueError, match=r"field 'vec' is in sources \['small'\] but not in \['bare'\]"
    ):
        create_loader(srcs, "train", 4)


def test_a_weighted_source_without_samples_in_the_split_is_named_with_the_split(data, tmp_path):
    write_dataset(str(tmp_path / "evalonly"), {"train": [], "val": [6]})
    srcs = [MixSource(data / "small", weight=1), MixSource(tmp_path / "evalonly", weight=5)]
    with pytest.raises(
        ValueError,
        match=r"^sources \['evalonly'\] have no samples in split 'train' but a quota of \[200\] "
        r"samples per epoch: leave them out of this split's mix$",
    ):
        create_loader(srcs, "train", 4, epoch_samples=240)


def test_a_state_from_another_mix_is_refused_naming_the_mix(data):
    first = _play(_loader(data), 1, stop=(0, 3))["state"]
    srcs = _sources(data)
    srcs[0] = MixSource(data / "small", samples=50)
    other = _loader(data, srcs, epoch_samples=1450)
    with pytest.raises(StateMismatchError, match=r"mix saved='mix-feistel/1:mixed:small,mid,big:"):
        other.load_state_dict(first)
    single = create_loader(str(data / "big"), "train", BATCH, seed=7)
    with pytest.raises(StateMismatchError, match=r"mix saved='mix-feistel/1.*now=None"):
        single.load_state_dict(first)


def test_mix_options_need_a_mix_and_valid_values(data):
    with pytest.raises(ValueError, match=r"\['batching', 'source_field'\] would be unused"):
        create_loader(str(data / "big"), "train", 4, batching="mixed", source_field="s")
    with pytest.raises(ValueError, match=r"batching must be one of \('mixed', 'stratified'\)"):
        create_loader(_sources(data), "train", 4, batching="random", epoch_samples=200)
    with pytest.raises(ValueError, match=r"sources share the names \['small'\]"):
        create_loader([MixSource(data / "small"), MixSource(data / "small")], "train", 4)


def test_stratified_resumes_exactly_but_not_on_another_topology(data):
    srcs = [MixSource(data / n, weight=w) for n, w in (("small", 0.1), ("mid", 0.3), ("big", 0.6))]

    def make(**kw):
        return _loader(data, srcs, batching="stratified", epoch_samples=600, **kw)

    full = _play(make(), 1)["seen"][0]
    head = _play(make(), 1, stop=(0, 23))
    again = make()
    again.load_state_dict(head["state"])
    assert head["seen"][0] + _play(again, 1)["seen"][0] == full
    with pytest.raises(StateMismatchError, match=r'stratified" resumes only on the topology'):
        make(num_workers=2).load_state_dict(head["state"])


@pytest.mark.parametrize("gather", [True, False])
def test_a_curriculum_the_sources_share_applies_to_every_sample(tmp_path, gather):
    from tests.test_curriculum_loader import CURR, variant_value, write_curriculum_dataset

    a = write_curriculum_dataset(tmp_path / "a", [30], CURR)
    b = write_curriculum_dataset(tmp_path / "b", [11, 9], CURR)
    srcs = [MixSource(a, repeat=1), MixSource(b, repeat=2)]
    loader = create_loader(srcs, "train", 7, source_field="src", gather=gather, drop_last=False)
    seen = Counter()
    for batch in loader:
        assert set(batch) >= {"steering", "steering_variant", "src", "idx"}
        for j in range(len(batch["__key__"])):
            v, i = int(batch["steering_variant"][j]), int(batch["idx"][j])
            want = np.zeros(4, np.float32) if v == 0 else variant_value(i, v)
            assert batch["steering"][j].numpy().tolist() == want.tolist()
            seen[int(batch["src"][j])] += 1
    assert seen == {0: 30, 1: 40}  # each sample of a once, of b twice
