"""Image fields are decoded on a small thread pool per process: the same samples in the same
order, the same errors at the same samples, and a pool that never travels in a pickle."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.decode.rows import IMAGE_THREADS
from wdsloader.errors import DecodeError

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("img") / "ds"
    rows = [
        {
            "__key__": f"k{i:04d}",
            "image": PIL.fromarray(np.full((8, 6, 3), i, dtype=np.uint8)),
            "label": i,
        }
        for i in range(40)
    ]
    build_shards(rows, str(root), shard_max_count=16)
    return str(root)


def _batches(root, threads, **kw):
    loader = create_loader(root, "train", batch_size=8, seed=2, drop_last=False, **kw)
    assert loader.dataset_obj.rows.threads == IMAGE_THREADS  # images: a pool by default
    loader.dataset_obj.rows.threads = threads
    return list(loader)


def test_threads_give_the_same_batches_in_the_same_order(images):
    a, b = _batches(images, IMAGE_THREADS), _batches(images, 0)
    assert len(a) == len(b) == 5
    for x, y in zip(a, b, strict=True):
        assert x["__key__"] == y["__key__"] and torch.equal(x["image"], y["image"])
        assert torch.equal(x["label"], y["label"])
    for batch in a:
        for key, image in zip(batch["__key__"], batch["image"], strict=True):
            assert int(image[0, 0, 0]) == int(key[1:])


def test_a_broken_image_is_the_same_error_with_threads(images, tmp_path):
    import shutil

    from wdsloader.format import Manifest

    root = tmp_path / "ds"
    shutil.copytree(images, root)
    shard = Manifest.load(str(root)).split("train").shards[1]
    path = root / shard.path
    data = bytearray(path.read_bytes())
    at = data.find(b"IDAT")  # inside the first PNG of the shard: its pixels
    data[at + 8 : at + 16] = b"\xff" * 8
    path.write_bytes(bytes(data))
    errors = []
    for threads in (IMAGE_THREADS, 0):
        with pytest.raises(DecodeError) as exc:
            _batches(str(root), threads, check_shards=False, shuffle=False)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and "k0016" in errors[0] and "image" in errors[0]


def test_the_pool_is_not_pickled(images):
    loader = create_loader(images, "train", batch_size=8)
    rows = loader.dataset_obj.rows
    rows._threads()  # made on first use (batches of one image size take the batch path)
    assert rows._pool is not None
    copy = pickle.loads(pickle.dumps(rows))
    assert copy._pool is None and copy.threads == IMAGE_THREADS
