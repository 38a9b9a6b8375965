"""Adopted foreign shards (webdataset's ShardWriter: a PAX header before every member; tars
with the members of each sample in any order) read through the whole-batch path where their
layout allows it, with the same values as parsing every sample."""

from __future__ import annotations

import io
import json
import random
import tarfile

import numpy as np
import pytest
import torch

from build_shards.adopt import adopt
from wdsloader import create_loader

N = 300


def _sample(i: int) -> dict[str, bytes]:
    arr = io.BytesIO()
    np.save(arr, np.full((2, 3), i, dtype=np.float32))
    return {
        "emb.npy": arr.getvalue(),
        "label.cls": str((i * 37) % 1000).encode(),
        "meta.json": json.dumps({"i": i, "name": "x" * (i % 9)}).encode(),
        "text.txt": ("t" * (i % 4)).encode(),
    }


def _write_tar(path, keys, shuffle_members: bool) -> None:
    rng = random.Random(0)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in keys:
            members = list(_sample(i).items())
            if shuffle_members:
                rng.shuffle(members)
            for ext, data in members:
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000.5 + i  # float mtime: PAX
                tf.addfile(info, io.BytesIO(data))


def _read(root, **kw):
    opts = {"batch_size": 32, "seed": 1, "drop_last": False, **kw}
    loader = create_loader(str(root), "train", **opts)
    return loader, list(loader)


def _check_values(batches) -> None:
    seen = []
    for b in batches:
        for k, emb, label, meta, text in zip(
            b["__key__"], b["emb"], b["label"], b["meta"], b["text"], strict=True
        ):
            i = int(k)
            assert torch.equal(emb, torch.full((2, 3), float(i)))
            assert int(label) == (i * 37) % 1000
            assert meta == {"i": i, "name": "x" * (i % 9)} and text == "t" * (i % 4)
            seen.append(i)
    assert sorted(seen) == list(range(N))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for name in x:
            if isinstance(x[name], torch.Tensor):
                assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name])
            else:
                assert x[name] == y[name]


def test_webdataset_shardwriter_shards_read_through_the_whole_batch_path(tmp_path):
    wds = pytest.importorskip("webdataset")
    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    with wds.ShardWriter(str(root / "train" / "s-%03d.tar"), maxcount=120, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"{i:06d}", **_sample(i)})
    with tarfile.open(root / "train" / "s-000.tar") as tf:
        assert any(m.pax_headers for m in tf.getmembers())  # PAX headers really are there
    adopt(str(root))
    fast, a = _read(root)
    slow, b = _read(root, gather=False)
    _check_values(a)
    _same(a, b)
    assert fast.stats["gathered_batches"] == len(a) == -(-N // 32)


@pytest.mark.parametrize("shuffle_members", [False, True])
def test_pax_shards_in_any_member_order_read_the_same_both_ways(tmp_path, shuffle_members):
    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    _write_tar(root / "train" / "a.tar", range(0, 170), shuffle_members)
    _write_tar(root / "train" / "b.tar", range(170, N), shuffle_members)
    adopt(str(root))
    fast, a = _read(root)
    slow, b = _read(root, gather=False)
    _check_values(a)
    _same(a, b)
    if not shuffle_members:  # one member order: the layout holds, every batch is gathered
        assert fast.stats["gathered_batches"] == len(a)
