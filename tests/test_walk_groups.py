"""Batches that mix shards of different layouts (a ``.cls`` whose width varies in some shards
and not in others, shards of different builds in one dataset) stay on the whole-batch path: the
walk over their variable members runs one layout group at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from wdsloader import create_loader


@pytest.fixture(scope="module")
def running_index(tmp_path_factory):
    """300 samples whose int label is the running index: shard 0 holds labels of 1-2 digits
    (no fixed offset for ``.cls``), shards 1-2 labels of 3 digits (``.cls`` in the layout)."""
    out = tmp_path_factory.mktemp("walk") / "ds"
    items = [
        {"emb": np.full(8, i, dtype=np.float32), "cls": i, "meta": {"i": i, "s": "x" * (i % 7)}}
        for i in range(300)
    ]
    build_shards(items, out, shards=ShardOptions(max_count=100))
    return out


def _epoch(root, **kwargs):
    loader = create_loader(root, "train", 50, shuffle=True, seed=3, **kwargs)
    batches = [
        (b["cls"].tolist(), b["emb"][:, 0].tolist(), [m["i"] for m in b["meta"]]) for b in loader
    ]
    return loader, batches


def test_the_shards_have_different_layouts(running_index):
    manifest = json.loads((running_index / "manifest.json").read_text())
    layouts = [set(s["layout"]) for s in manifest["splits"]["train"]["shards"]]
    assert "cls" not in layouts[0] and all("cls" in layout for layout in layouts[1:])


def test_mixed_layout_batches_are_walked_not_parsed_one_by_one(running_index):
    loader, batches = _epoch(running_index)
    # every batch mixes the layouts (a shuffled epoch over 3 shards of 100)
    assert loader.stats["gathered_batches"] == len(batches) == 6
    assert loader.stats["parsed_samples"] == 0 and loader.stats["parsed_batches"] == 0
    labels = sorted(c for cls, _, _ in batches for c in cls)
    assert labels == list(range(300))
    for cls, emb, meta in batches:  # each sample's fields belong together
        assert cls == [int(e) for e in emb] == meta
    # the same values as parsing every sample
    slow, parsed = _epoch(running_index, gather=False)
    assert parsed == batches
    assert slow.stats["parsed_samples"] == 300 and slow.stats["parsed_batches"] == 6


def test_a_cls_width_in_some_layouts_only_keeps_one_gather_and_one_walk(running_index):
    """Shards that differ only in whether ``.cls`` has a fixed offset: their samples are
    gathered in one piece (one layout for the gathered fields) and every batch is walked once,
    from one offset (the ``.cls`` header), with the steps of earlier batches."""
    loader, batches = _epoch(running_index)
    col = loader.dataset_obj.columnar
    assert col is not None and col.block_len > 0
    assert len(set(col.layout_id.tolist())) == 1
    assert len(set(col.finder.walk_from.tolist())) == 1
    assert [kind for kind, _ in col.finder.walks] == ["batch"]
    assert loader.stats["parsed_samples"] == 0
    _, parsed = _epoch(running_index, gather=False)
    assert parsed == batches
