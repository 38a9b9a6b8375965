"""Every batch says where its samples come from: ``__index__`` (the sample's position in its
split: ``ShardDataset(...)[i]`` gives it back) and, reading a mix, ``__source__``; on the
whole-batch path and the per-sample one, with any collator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from wdsloader import DecodeOptions, Mix, MixSource, ShardDataset, create_loader


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("prov")
    out = {}
    for name, n in (("a", 90), ("b", 40)):
        items = [
            {"__key__": f"{name}{i:03d}", "emb": np.full(3, i, np.float32), "meta": {"i": i}}
            for i in range(n)
        ]
        build_shards(items, root / name, shards=ShardOptions(max_count=25))
        out[name] = root / name
    return out


def _keys_by_index(root):
    ds = ShardDataset(root, fields=[])
    return [ds[i]["__key__"] for i in range(len(ds))]


@pytest.mark.parametrize("gather", [True, False])
def test_every_batch_names_its_samples_positions(built, gather):
    keys = _keys_by_index(built["a"])
    loader = create_loader(
        built["a"], "train", 16, 2, shuffle=True, decode=DecodeOptions(gather=gather)
    )
    seen = []
    for batch in loader:
        index = batch["__index__"]
        assert index.dtype == torch.int64
        assert [keys[i] for i in index.tolist()] == batch["__key__"]
        seen += index.tolist()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 80  # drop_last: 5 batches of 16
    assert loader.stats["gathered_batches"] == (5 if gather else 0)


def test_a_mix_names_each_samples_source_and_position(built):
    keys = {name: _keys_by_index(root) for name, root in built.items()}
    mix = Mix([MixSource(built["a"], name="a"), MixSource(built["b"], name="b")])
    loader = create_loader(mix, "train", 10, 0, shuffle=True, seed=2)
    names = ("a", "b")
    for batch in loader:
        src, index = batch["__source__"].tolist(), batch["__index__"].tolist()
        assert [keys[names[s]][i] for s, i in zip(src, index, strict=True)] == batch["__key__"]


def test_a_collator_that_builds_its_own_batch_gets_them_too(built):
    def own(samples):
        return {"emb": torch.stack([torch.as_tensor(s["emb"]) for s in samples])}

    keys = _keys_by_index(built["a"])
    batch = next(iter(create_loader(built["a"], "train", 8, collate_fn=own, shuffle=False)))
    assert sorted(batch) == ["__index__", "emb"]
    assert batch["emb"][:, 0].long().tolist() == [int(keys[i][1:]) for i in batch["__index__"]]


def test_a_callable_collator_sees_each_samples_index(built):
    samples = next(iter(create_loader(built["a"], "train", 8, collate_fn=list, shuffle=False)))
    assert [int(s["__index__"]) for s in samples] == list(range(8))
