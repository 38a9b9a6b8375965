"""The curriculum inside the loader: per-sample variants that depend on (seed, epoch, key) only,
only the chosen variant decoded, force_steering, manifest defaults and overrides."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
import torch

from tests.dataset_factory import npy_bytes, write_split
from wdsloader import Curriculum, create_loader, set_epoch
from wdsloader.curriculum import fixed, zero_decay
from wdsloader.errors import DecodeError, StateMismatchError
from wdsloader.format import FieldSpec, Manifest

D = 4
VARIANTS = {"zero": None, "a": "steer_a", "b": "steer_b", "c": "steer_c"}
SCHEMA = {
    "vec": FieldSpec(ext="vec.npy", encoding="npy", dtype="float32", shape=["D"]),
    "steer_a": FieldSpec(ext="steer_a.npy", encoding="npy", dtype="float32", shape=["D"]),
    "steer_b": FieldSpec(ext="steer_b.npy", encoding="npy", dtype="float32", shape=["D"]),
    "steer_c": FieldSpec(ext="steer_c.npy", encoding="npy", dtype="float32", shape=["D"]),
    "idx": FieldSpec(ext="idx.cls", encoding="cls", dtype="int64", shape=[]),
    "meta": FieldSpec(ext="meta.json", encoding="json", dtype="json"),
}


def variant_value(i: int, v: int) -> np.ndarray:
    """What variant ``v`` (1..3) of sample ``i`` stores: i*10 + v in every element."""
    return np.full(D, i * 10 + v, dtype=np.float32)


def write_curriculum_dataset(root, counts, curriculum=None, corrupt=None):
    """Samples with three stored variants; ``corrupt=(i, ext)`` breaks that member of sample i
    (same size, bad .npy magic)."""

    def make_sample(i, s):
        members = [
            ("idx.cls", str(i).encode()),
            ("steer_a.npy", npy_bytes(variant_value(i, 1))),
            ("steer_b.npy", npy_bytes(variant_value(i, 2))),
            ("steer_c.npy", npy_bytes(variant_value(i, 3))),
            ("vec.npy", npy_bytes(np.full(D, i, dtype=np.float32))),
            ("meta.json", b'{"i": %d}' % i),
        ]
        if corrupt is not None and corrupt[0] == i:
            members = [(e, b"XX" + d[2:] if e == corrupt[1] else d) for e, d in members]
        return f"k{i:07d}", members

    manifest = Manifest(schema=dict(SCHEMA), dims={"D": D})
    if curriculum is not None:
        manifest.loader_defaults["curriculum"] = curriculum.to_dict()
    manifest.splits["train"] = write_split(str(root), "train", counts, make_sample)
    manifest.save(str(root))
    return str(root)


CURR = Curriculum(VARIANTS, schedule=zero_decay(), seed=7)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_curriculum_dataset(tmp_path_factory.mktemp("curr") / "ds", [60, 45, 83], CURR)


def epoch_samples(loader):
    """{key: (variant, steering row, idx)} of one pass."""
    out = {}
    for b in loader:
        for j, key in enumerate(b["__key__"]):
            assert key not in out
            out[key] = (int(b["steering_variant"][j]), b["steering"][j].clone(), int(b["idx"][j]))
    return out


def check_consistent(samples):
    """Each sample's steering is the stored value of its variant (zeros for ``zero``)."""
    for key, (v, steering, i) in samples.items():
        expected = np.zeros(D, np.float32) if v == 0 else variant_value(i, v)
        assert torch.equal(steering, torch.from_numpy(expected)), (key, v)


@pytest.mark.parametrize("gather", [True, False])
def test_batches_replace_variants_by_the_drawn_one(ds, gather):
    loader = create_loader(ds, "train", batch_size=16, drop_last=False, gather=gather)
    first = next(iter(loader))
    assert set(first) == {
        "__key__",
        "__index__",
        "vec",
        "idx",
        "meta",
        "steering",
        "steering_variant",
    }
    assert first["steering"].dtype == torch.float32 and first["steering"].shape == (16, D)
    assert first["steering_variant"].dtype == torch.int64
    samples = epoch_samples(create_loader(ds, "train", batch_size=16, drop_last=False))
    assert len(samples) == 188
    check_consistent(samples)
    # the draw is the curriculum's pure function of (seed, epoch, key)
    keys = sorted(samples)
    assert [samples[k][0] for k in keys] == CURR.draw(keys, 0, 7).tolist()
    stats = loader.stats
    assert (stats["gathered_batches"] > 0) == gather


def test_draw_independent_of_workers_order_and_resume(ds):
    base = epoch_samples(create_loader(ds, "train", batch_size=8, drop_last=False, seed=0))
    other_order = epoch_samples(
        create_loader(ds, "train", batch_size=5, drop_last=False, seed=3, num_workers=2)
    )
    assert {k: v[0] for k, v in base.items()} == {k: v[0] for k, v in other_order.items()}
    # resume mid-epoch: the remaining samples keep their variants
    loader = create_loader(ds, "train", batch_size=8, drop_last=False)
    it = iter(loader)
    seen = {}
    for _ in range(5):
        b = next(it)
        seen.update(zip(b["__key__"], b["steering_variant"].tolist(), strict=True))
    state = loader.state_dict()
    resumed = create_loader(ds, "train", batch_size=8, drop_last=False)
    resumed.load_state_dict(state)
    for b in resumed:
        seen.update(zip(b["__key__"], b["steering_variant"].tolist(), strict=True))
    assert seen == {k: v[0] for k, v in base.items()}


def test_epoch_changes_the_mix(ds):
    loader = create_loader(ds, "train", batch_size=16, drop_last=False)
    e0 = epoch_samples(loader)
    set_epoch(loader, 100)
    e100 = epoch_samples(loader)
    zeros0 = sum(v[0] == 0 for v in e0.values())
    zeros100 = sum(v[0] == 0 for v in e100.values())
    assert zeros0 > 2 * zeros100  # P(zero) 0.5 -> 0.1
    check_consistent(e100)


@pytest.mark.parametrize("workers", [0, 2])
def test_force_steering_reaches_persistent_workers(ds, workers):
    extra = {"persistent_workers": True} if workers else {}
    loader = create_loader(
        ds, "train", batch_size=16, drop_last=False, num_workers=workers, **extra
    )
    ds_obj = loader.dataset_obj
    drawn = epoch_samples(loader)
    assert len({v[0] for v in drawn.values()}) == 4
    ds_obj.force_steering("b")
    assert ds_obj.forced_steering == "b"
    forced = epoch_samples(loader)
    assert {v[0] for v in forced.values()} == {2}
    check_consistent(forced)
    ds_obj.force_steering(None)
    set_epoch(loader, 0)
    again = epoch_samples(loader)
    assert {k: v[0] for k, v in again.items()} == {k: v[0] for k, v in drawn.items()}


def test_force_steering_rejects_unknown_names(ds):
    loader = create_loader(ds, "train", batch_size=16)
    with pytest.raises(ValueError, match="'centroid'; valid variants: zero, a, b, c"):
        loader.dataset_obj.force_steering("centroid")
    plain = create_loader(ds, "train", batch_size=16, curriculum=False)
    with pytest.raises(ValueError, match="no curriculum"):
        plain.dataset_obj.force_steering("a")


def test_manifest_default_override_and_off(ds):
    only_c = Curriculum(VARIANTS, schedule=fixed({"c": 1.0}), index_output=None)
    samples = create_loader(ds, "train", batch_size=32, drop_last=False, curriculum=only_c)
    batch = next(iter(samples))
    assert "steering_variant" not in batch
    assert torch.equal(
        batch["steering"][0], torch.from_numpy(variant_value(int(batch["idx"][0]), 3))
    )
    raw = next(iter(create_loader(ds, "train", batch_size=4, curriculum=False)))
    assert {"steer_a", "steer_b", "steer_c"} <= set(raw) and "steering" not in raw
    as_dict = create_loader(ds, "train", batch_size=4, curriculum=only_c.to_dict())
    assert as_dict.dataset_obj.curriculum.names == only_c.names
    # fields without the output: no curriculum; with it: only what was asked
    picked = next(iter(create_loader(ds, "train", batch_size=4, fields=["vec", "steering"])))
    assert set(picked) == {"__key__", "__index__", "vec", "steering", "steering_variant"}
    with pytest.raises(ValueError, match="request 'steering' instead"):
        create_loader(ds, "train", batch_size=4, fields=["steer_a", "steering"])


@pytest.mark.parametrize("gather", [True, False])
def test_only_the_chosen_variant_is_decoded(tmp_path, gather):
    root = write_curriculum_dataset(tmp_path / "bad", [30], CURR, corrupt=(11, "steer_b.npy"))
    loader = create_loader(root, "train", batch_size=10, drop_last=False, gather=gather)
    loader.dataset_obj.force_steering("a")
    samples = epoch_samples(loader)  # the broken member is never decoded
    assert len(samples) == 30
    check_consistent(samples)
    loader.dataset_obj.force_steering("b")
    with pytest.raises(DecodeError, match=r"k0000011.*steer_b"):
        epoch_samples(loader)


def test_frequencies_follow_the_schedule_over_20000_samples(tmp_path):
    root = write_curriculum_dataset(tmp_path / "big", [5000] * 4, CURR)
    loader = create_loader(root, "train", batch_size=500, drop_last=False, fields=["steering"])
    for epoch in (0, 50, 100):
        set_epoch(loader, epoch)
        counts = Counter()
        for b in loader:
            counts.update(b["steering_variant"].tolist())
        assert sum(counts.values()) == 20000
        freq = np.array([counts[v] / 20000 for v in range(4)])
        assert np.abs(freq - CURR.probabilities(epoch)).max() < 0.02, (epoch, freq)


def test_build_shards_stores_the_curriculum_as_the_default(tmp_path):
    from build_shards import build_shards

    rows = [
        {
            "__key__": f"q{i:04d}",
            "q": np.full(D, i, np.float32),
            "steer_a": variant_value(i, 1),
            "steer_b": variant_value(i, 2),
            "steer_c": variant_value(i, 3),
            "i": i,
        }
        for i in range(40)
    ]
    out = build_shards(rows, str(tmp_path / "built"), curriculum=CURR, shard_max_count=16)
    assert out.loader_defaults["curriculum"] == CURR.to_dict()
    assert Manifest.load(str(tmp_path / "built")).loader_defaults["curriculum"]["seed"] == 7
    samples = {}
    for b in create_loader(str(tmp_path / "built"), "train", batch_size=8, drop_last=False):
        for key, v, row, i in zip(
            b["__key__"], b["steering_variant"], b["steering"], b["i"], strict=True
        ):
            samples[key] = (int(v), row.clone(), int(i))
    assert len(samples) == 40
    check_consistent(samples)
    wrong = Curriculum({"zero": None, "a": "steer_a", "x": "missing_field"})
    with pytest.raises(ValueError, match="missing_field"):
        build_shards(rows, str(tmp_path / "wrong"), curriculum=wrong)
    assert not (tmp_path / "wrong" / "manifest.json").exists()


def test_builder_dataset_takes_the_block_path_and_matches_the_parser(tmp_path):
    from build_shards import build_shards

    rows = [
        {
            "__key__": f"q{i:04d}",
            "q": np.full(D, i, np.float32),
            "steer_a": variant_value(i, 1),
            "steer_b": variant_value(i, 2),
            "steer_c": variant_value(i, 3),
            "meta": {"i": i, "pad": "x" * (i % 5)},
        }
        for i in range(300)
    ]
    build_shards(rows, str(tmp_path / "b"), curriculum=CURR, shard_max_count=64)
    opts = {"batch_size": 32, "drop_last": False, "seed": 2}
    fast = create_loader(str(tmp_path / "b"), "train", **opts)
    assert fast.dataset_obj.columnar.block_len > 0  # one gather per batch serves every field
    slow = create_loader(str(tmp_path / "b"), "train", gather=False, **opts)
    for epoch in (0, 100):
        set_epoch(fast, epoch)
        set_epoch(slow, epoch)
        a, b = list(fast), list(slow)
        assert len(a) == len(b) == 10
        for x, y in zip(a, b, strict=True):
            assert list(x) == list(y) and x["__key__"] == y["__key__"] and x["meta"] == y["meta"]
            for name in ("q", "steering", "steering_variant"):
                assert torch.equal(x[name], y[name]), name
    assert fast.stats["gathered_batches"] == 20


def test_explicit_curriculum_whose_output_is_not_in_fields_is_an_error(ds):
    with pytest.raises(
        ValueError, match=r"curriculum output 'steering' is not in fields=\['vec'\]"
    ):
        create_loader(ds, "train", batch_size=4, fields=["vec"], curriculum=CURR)
    with pytest.raises(ValueError, match=r"is not in fields"):
        create_loader(ds, "train", batch_size=4, fields=["vec"], curriculum=True)
    # the manifest's default curriculum is left out quietly: it was not asked for
    plain = next(iter(create_loader(ds, "train", batch_size=4, fields=["vec"])))
    assert set(plain) == {"__key__", "__index__", "vec"}


def test_state_from_another_curriculum_is_refused(ds):
    kw = dict(batch_size=8, drop_last=False)
    loader = create_loader(ds, "train", **kw)
    next(iter(loader))
    state = loader.state_dict()
    other = Curriculum(VARIANTS, schedule=fixed([0.1, 0.3, 0.3, 0.3]), seed=7)
    with pytest.raises(
        StateMismatchError, match=r"differs: curriculum saved='steering:\w+' now='steering:\w+'$"
    ):
        create_loader(ds, "train", curriculum=other, **kw).load_state_dict(state)
    with pytest.raises(
        StateMismatchError, match=r"differs: fields .*curriculum saved=.* now='none'"
    ):
        create_loader(ds, "train", curriculum=False, **kw).load_state_dict(state)
    same = create_loader(ds, "train", curriculum=CURR, **kw)  # the manifest's, given explicitly
    same.load_state_dict(state)
    assert len(list(same)) == len(loader) - 1


def test_steering_and_schema_are_loader_methods(ds):
    loader = create_loader(ds, "train", batch_size=16, drop_last=False)
    assert set(loader.output_schema()) == {"vec", "idx", "meta", "steering", "steering_variant"}
    assert loader.output_schema() == loader.dataset_obj.output_schema()
    loader.force_steering("c")
    assert loader.dataset_obj.forced_steering == "c"
    assert {v[0] for v in epoch_samples(loader).values()} == {3}
    loader.dataset_obj.force_steering(None)  # the documented alias
    loader.set_epoch(100)
    assert loader.dataset_obj.epoch == 100


def test_force_variant_is_the_generic_name_and_force_steering_its_alias(ds):
    loader = create_loader(ds, "train", batch_size=16, drop_last=False)
    loader.force_variant("c")
    assert loader.dataset_obj.forced_variant == "c" and loader.dataset_obj.forced_steering == "c"
    assert {v[0] for v in epoch_samples(loader).values()} == {3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the steering-dataset names stay, without a warning
        loader.force_steering("b")
        assert loader.dataset_obj.forced_variant == "b"
        loader.dataset_obj.force_steering("a")
        assert loader.dataset_obj.forced_variant == "a"
        assert loader.dataset_obj is loader.dataset
    loader.dataset_obj.force_variant(None)
    assert loader.dataset_obj.forced_variant is None
    with pytest.raises(ValueError, match="'centroid'; valid variants: zero, a, b, c"):
        loader.force_variant("centroid")
