"""Batches handed from worker processes through one reused shared-memory block per batch."""

from __future__ import annotations

import gc
import io
import pickle
from multiprocessing import reduction

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from tests.dataset_factory import write_dataset
from wdsloader import batch_arrays, create_loader
from wdsloader.stream.options import WorkerOptions
from wdsloader.stream.shm_batches import HEADER, BlockRing, PackedBatch

COUNTS = [37, 23, 41, 9, 30]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("shm") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


def sent(obj):
    """``obj`` pickled the way a worker process sends it, then unpickled."""
    buf = io.BytesIO()
    reduction.ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return pickle.loads(buf.getvalue())


def counted_descriptors(monkeypatch) -> list[int]:
    """The file descriptors sent from now on (the list fills as they are)."""
    fds: list[int] = []
    dup = reduction.DupFd
    monkeypatch.setattr(reduction, "DupFd", lambda fd: fds.append(fd) or dup(fd))
    return fds


def a_batch():
    wide = torch.arange(6 * 700, dtype=torch.float32).view(6, 700)
    return {
        "__key__": [f"k{i}" for i in range(6)],
        "x": wide,
        "cols": wide[:, ::7],  # not contiguous
        "label": torch.arange(6),
        "mask": torch.tensor([True, False, True, True, False, False]),
        "one": torch.tensor(3.5, dtype=torch.float64),
        "none": torch.empty(0, 4, dtype=torch.int32),
        "meta": [{"i": i} for i in range(6)],
    }


def test_a_batch_arrives_equal_in_one_block_with_one_descriptor(monkeypatch):
    want = a_batch()
    ring = BlockRing()
    fds = counted_descriptors(monkeypatch)
    packed = ring.pack(a_batch())
    assert isinstance(packed, PackedBatch)
    got = sent(packed)
    assert len(fds) == 1  # torch alone sends one per tensor (six here)
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value
    storages = {got[n].untyped_storage().data_ptr() for n in ("x", "cols", "label", "mask")}
    assert len(storages) == 1
    del got
    gc.collect()
    # the block again: already mapped here, so no descriptor goes with the batch
    again = sent(ring.pack(a_batch()))
    assert len(fds) == 1 and ring.allocated == 1
    assert torch.equal(again["x"], want["x"]) and torch.equal(again["cols"], want["cols"])
    ring.close()


def test_a_block_is_reused_only_once_no_tensor_of_its_batch_is_left():
    ring = BlockRing(size=2)
    first = sent(ring.pack(a_batch()))
    row = first["x"][2]  # a view keeps the whole batch's block
    del first
    gc.collect()
    second = sent(ring.pack({"x": torch.full((6, 700), -1.0)}))
    assert ring.allocated == 2
    assert torch.equal(row, torch.arange(1400, 2100, dtype=torch.float32))  # not overwritten
    # every block in use: the batch goes torch's way, as it came
    plain = {"x": torch.ones(3)}
    assert ring.pack(plain) is plain
    del row, second
    gc.collect()
    third = sent(ring.pack(a_batch()))
    assert ring.allocated == 2 and ring.packed == 3
    assert torch.equal(third["x"], a_batch()["x"])
    ring.close()


def test_a_block_that_cannot_be_made_leaves_the_batch_to_torch(monkeypatch):
    def no_more(*_args):
        raise OSError(24, "Too many open files")

    ring = BlockRing()
    monkeypatch.setattr("os.memfd_create", no_more)
    batch = a_batch()
    assert ring.pack(batch) is batch
    batch_arrays.set_lender(ring.lend)
    try:
        assert batch_arrays.empty((4, 8), np.float32).shape == (4, 8)
    finally:
        batch_arrays.set_lender(None)
    assert ring.allocated == 0


def test_batches_without_cpu_tensors_go_as_they_came():
    ring = BlockRing()
    for batch in ([torch.ones(3)], {"k": ["a"]}, {"t": torch.ones(2).share_memory_()}):
        assert ring.pack(batch) is batch
    assert ring.allocated == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_processes_send_each_batch_in_one_block_and_threads_do_not(ds, persistent):
    kw = {"batch_size": 4, "drop_last": False, "seed": 5, "num_workers": 2}
    procs = create_loader(ds, "train", workers=WorkerOptions(persistent_workers=persistent), **kw)
    threads = create_loader(ds, "train", workers=WorkerOptions(mode="thread"), **kw)
    for _epoch in range(2):
        want, seen = list(threads), []
        for b in want:
            by_thread = [v for v in b.values() if isinstance(v, torch.Tensor)]
            assert len({t.untyped_storage().data_ptr() for t in by_thread}) == len(by_thread)
        for i, a in enumerate(procs):  # each batch dropped before the next (blocks reused)
            b = want[i]
            assert list(a) == list(b) and a["__key__"] == b["__key__"]
            for name, value in b.items():
                if isinstance(value, torch.Tensor):
                    assert value.dtype == a[name].dtype and torch.equal(a[name], value)
                else:
                    assert a[name] == value
            tensors = [v for v in a.values() if isinstance(v, torch.Tensor)]
            assert len(tensors) >= 2
            assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
            seen.extend(a["__index__"].tolist())
        assert i + 1 == len(want)
        assert sorted(seen) == list(range(sum(COUNTS)))  # exactly once


def test_an_array_made_in_a_lent_block_is_sent_where_it_lies():
    ring = BlockRing()
    image = batch_arrays.empty((6, 32, 32, 3), np.uint8)  # no lender: a plain array
    assert image.base is None
    batch_arrays.set_lender(ring.lend)
    try:
        image = batch_arrays.empty((6, 32, 32, 3), np.uint8)
    finally:
        batch_arrays.set_lender(None)
    image[...] = np.arange(image.size, dtype=np.uint64).reshape(image.shape) % 251
    want = image.copy()
    packed = ring.pack({"image": torch.from_numpy(image), "label": torch.arange(6)})
    assert len(packed.blocks) == 2 and packed.specs["image"][0] == 1  # the lent block
    got = sent(packed)
    del image, packed
    gc.collect()
    assert np.array_equal(got["image"].numpy(), want) and got["label"].tolist() == list(range(6))
    assert ring.lend(want.nbytes) is not None and ring.allocated == 3  # in use: another one
    del got
    gc.collect()
    again = ring.lend(want.nbytes)  # the first lent block, free again
    assert again is not None and again.ctypes.data == ring.lent[0][2].ctypes.data + HEADER


def test_a_lent_array_dropped_unsent_frees_its_block():
    ring = BlockRing(lent=1)
    first = ring.lend(1 << 16)
    assert ring.lend(1 << 16) is None  # the one lent block is taken
    del first
    gc.collect()
    assert ring.lend(1 << 16) is not None and ring.allocated == 1


def test_worker_processes_send_decoded_images_without_a_copy(tmp_path):
    pytest.importorskip("simplejpeg")
    from tests.test_decode_images import _jpeg, _photo

    rows = [
        {"__key__": f"k{i:04d}", "image.jpg": _jpeg(_photo(48, 40, i)), "label": i}
        for i in range(40)
    ]
    build_shards(rows, str(tmp_path / "ds"), shards=ShardOptions(max_count=16))
    kw = {"batch_size": 8, "seed": 1, "num_workers": 2}
    want = list(
        create_loader(str(tmp_path / "ds"), "train", **kw, workers=WorkerOptions(mode="thread"))
    )
    for i, got in enumerate(create_loader(str(tmp_path / "ds"), "train", **kw)):
        assert got["__key__"] == want[i]["__key__"]
        assert torch.equal(got["image"], want[i]["image"]) and torch.equal(
            got["label"], want[i]["label"]
        )
        # the images in a block of their own (lent to the decoder), the rest copied in one
        image, label = got["image"].untyped_storage(), got["label"].untyped_storage()
        assert image.data_ptr() != label.data_ptr()
        assert label.data_ptr() == got["__index__"].untyped_storage().data_ptr()
        assert image.nbytes() >= got["image"].nbytes > label.nbytes()
