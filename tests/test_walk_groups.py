"""Batches that mix shards of different layouts (a ``.cls`` whose width varies in some shards
and not in others, shards of different builds in one dataset) stay on the whole-batch path: the
walk over their variable members runs one layout group at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from wdsloader import DecodeOptions, create_loader


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


def _write_adopted(folder, first: int, n: int, per_shard: int, order=None, broken=None) -> None:
    """Tars as webdataset's ShardWriter writes them (a PAX header before every member, from the
    float mtime), adopted: members ``.cls`` (4 digits: at a fixed offset), ``.emb.npy``,
    ``.meta.json``; keys ``wNNNNN``. ``order(i)``: the member order of sample ``i``; sample
    ``broken`` has a JSON member that does not decode."""
    import io
    import tarfile

    from build_shards.adopt import adopt

    folder.mkdir(parents=True)
    for s in range(0, n, per_shard):
        with tarfile.open(folder / f"shard-{s // per_shard:04d}.tar", "w", format=tarfile.PAX_FORMAT) as tf:  # fmt: skip
            for i in range(first + s, first + min(s + per_shard, n)):
                npy = io.BytesIO()
                np.save(npy, np.full(8, i, dtype=np.float32))
                members = {
                    "cls": str(i).encode(),
                    "emb.npy": npy.getvalue(),
                    "meta.json": b"{oops" if i == broken else json.dumps({"i": i}).encode(),
                }
                for ext in order(i) if order else members:
                    info = tarfile.TarInfo(f"w{i:05d}.{ext}")
                    info.size, info.mtime = len(members[ext]), 1.5
                    tf.addfile(info, io.BytesIO(members[ext]))
    adopt(folder)


def test_built_and_adopted_shards_in_one_mix_stay_on_the_whole_batch_path(running_index, tmp_path):
    """A mix of built shards (a ``.cls`` of 1-3 digits, in the layout of some shards only) and
    adopted ones (PAX headers, another member order, longer keys): every batch mixes shards of
    several layouts; each layout group is gathered and walked on its own, and the batches equal
    those of parsing every sample."""
    from wdsloader.mix import MixSource

    _write_adopted(tmp_path / "adopted", 1000, 200, 100)
    mix = [MixSource(str(running_index), repeat=1), MixSource(str(tmp_path / "adopted"), repeat=1)]
    loader, batches = _epoch(mix)
    assert sorted(c for cls, _, _ in batches for c in cls) == [*range(300), *range(1000, 1200)]
    for cls, emb, meta in batches:
        assert cls == [int(e) for e in emb] == meta
    assert loader.stats["gathered_batches"] == len(batches) == 10
    assert loader.stats["parsed_samples"] == 0 and loader.stats["parsed_batches"] == 0
    col = loader.dataset_obj.columnar
    assert col is not None and len(set(col.group.tolist())) >= 2
    slow, parsed = _epoch(mix, decode=DecodeOptions(gather=False))
    assert parsed == batches
    assert slow.stats["parsed_samples"] == 500
    # whole batches, keys and every field, as the parser gives them
    rows = DecodeOptions(gather=False)
    fast_all = [_whole(b) for b in create_loader(mix, "train", 50, shuffle=True, seed=3)]
    slow_all = [
        _whole(b) for b in create_loader(mix, "train", 50, shuffle=True, seed=3, decode=rows)
    ]
    assert fast_all == slow_all


def _whole(batch) -> dict:
    return {
        name: value.tolist() if hasattr(value, "tolist") else list(value)
        for name, value in batch.items()
    }


def test_a_batch_parsed_sample_by_sample_is_not_counted_as_gathered(tmp_path):
    """Samples whose variable members come in two orders: no walk finds them for the whole
    batch, each sample is parsed; ``loader.stats`` says so (parsed, not gathered)."""
    order = lambda i: ("emb.npy", "cls", "meta.json") if i % 2 else ("emb.npy", "meta.json", "cls")  # noqa: E731
    _write_adopted(tmp_path / "ds", 0, 100, 100, order)
    loader, batches = _epoch(tmp_path / "ds")
    assert loader.dataset_obj.columnar is not None and len(batches) == 2
    assert loader.stats["parsed_batches"] == 2 and loader.stats["parsed_samples"] == 100
    assert loader.stats["gathered_batches"] == 0
    _, parsed = _epoch(tmp_path / "ds", decode=DecodeOptions(gather=False))
    assert parsed == batches


def test_an_error_in_a_mixed_layout_batch_names_its_shard_sample_and_field(running_index, tmp_path):
    """A sample that does not decode, in a batch decoded layout group by group: the error (or
    the skip) is that sample's, as when every sample is parsed."""
    from wdsloader import ErrorPolicy
    from wdsloader.errors import DecodeError
    from wdsloader.mix import MixSource

    _write_adopted(tmp_path / "adopted", 1000, 200, 100, broken=1150)
    mix = [MixSource(str(running_index), repeat=1), MixSource(str(tmp_path / "adopted"), repeat=1)]
    messages = []
    for gather in (True, False):
        with pytest.raises(DecodeError) as err:
            _epoch(mix, decode=DecodeOptions(gather=gather))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "shard-0001.tar" in messages[0] and "'w01150'" in messages[0] and "meta" in messages[0]
    skip = ErrorPolicy(on_error="skip")
    fast, batches = _epoch(mix, errors=skip)
    slow, parsed = _epoch(mix, errors=skip, decode=DecodeOptions(gather=False))
    assert batches == parsed and 1150 not in {c for cls, _, _ in batches for c in cls}
    assert fast.stats["skipped_samples"] == slow.stats["skipped_samples"] == 1
    assert fast.stats["parsed_samples"] == 0


def test_layout_groups_that_start_their_walks_alike_keep_their_steps_apart(tmp_path, monkeypatch):
    """Two adopted sources whose layouts differ (``.emb.npy`` first or second) but whose walks
    both start at the first header: each group walks step by step once, then every batch of it
    checks the steps of its own group in one pass (no walk thrown away for the other's)."""
    from wdsloader.decode import finder
    from wdsloader.mix import MixSource

    _write_adopted(tmp_path / "a", 1000, 200, 100)
    _write_adopted(tmp_path / "b", 2000, 200, 100, lambda i: ("emb.npy", "cls", "meta.json"))
    walks = []
    step_by_step = finder.walk_members
    monkeypatch.setattr(finder, "walk_members", lambda *a, **k: walks.append(1) or step_by_step(*a, **k))  # fmt: skip
    mix = [MixSource(str(tmp_path / "a"), repeat=1), MixSource(str(tmp_path / "b"), repeat=1)]
    loader, batches = _epoch(mix)
    col = loader.dataset_obj.columnar
    assert col is not None and len(set(col.finder.walk_from.tolist())) == 1
    assert len(set(col.group.tolist())) == 2 and len(batches) == 8
    assert len(walks) == 2 and loader.stats["parsed_samples"] == 0
    _, parsed = _epoch(mix, decode=DecodeOptions(gather=False))
    assert parsed == batches
