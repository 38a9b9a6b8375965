"""Long fixed-size fields read straight into their batch arrays (one copy from the page cache):
the values are exactly the per-sample path's, the placed bytes never pass through the read
buffer, a batch kept alive is never overwritten, and a corrupt member header or a layout that
lies is the same error as on the other paths."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.decode.placement import restore
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest, ShardInfo, iter_members
from wdsloader.format.ustar import BLOCK
from wdsloader.io import buffers
from wdsloader.io.buffers import BufferPool
from wdsloader.io.ranges import IOV_MAX, Hole, preadv_all, split_range
from wdsloader.stream import reader as reader_module

N = 45  # 3 shards of 16, 16 and 13 samples; batches of 8: the last one holds 5
BLOB = 20_000  # bytes, declared uint8: placed
EMB = 5_000  # float32 elements (20,000 bytes after a .npy header): placed
PLACED = {"blob", "emb"}


def _blob(i: int) -> bytes:
    return ((np.arange(BLOB, dtype=np.int64) * 7 + i) % 251).astype(np.uint8).tobytes()


def _emb(i: int) -> np.ndarray:
    return np.arange(EMB, dtype=np.float32) + i * 0.5


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    rows = [
        {
            "__key__": f"s{i:05d}",
            "blob.bin": _blob(i),
            "emb": _emb(i),
            "label": i,
            "meta": {"i": i, "pad": "x" * (i % 9)},
        }
        for i in range(N)
    ]
    out = str(tmp_path_factory.mktemp("preadv") / "ds")
    build_shards(rows, out, schema={"blob": {"dtype": "uint8"}}, shard_max_count=16)
    return out


@pytest.fixture
def seen(monkeypatch):
    """The placed fields of every batch the loaders of the test read."""
    got: list[set[str]] = []
    original = reader_module.BatchReader.read

    def spy(self, batches, pool=None, place=False, prefetch=None):
        raws = original(self, batches, pool, place, prefetch)
        got.extend(set(r.placed) for r in raws)
        return raws

    monkeypatch.setattr(reader_module.BatchReader, "read", spy)
    return got


def _passes(root, group=None, **kwargs):
    loader = create_loader(root, "train", batch_size=8, seed=3, drop_last=False, **kwargs)
    if group is not None:
        loader.dataset_obj.readahead_batches = group
    return loader, [b for epoch in range(2) for b in _epoch(loader, epoch)]


def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def _same(a, b):
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("group", [1, 3])
def test_placed_fields_equal_the_parsed_values(root, seen, shuffle, group):
    """Shuffled or in order (one run of many samples), a batch or a group of batches spanning
    shards per read, the last batch partial: the values of the per-sample path."""
    loader, got = _passes(root, group, shuffle=shuffle)
    assert set(loader.dataset_obj.reader.placement.targets) == PLACED
    placed = list(seen)
    _, want = _passes(root, shuffle=shuffle, gather=False)
    assert [len(b["__key__"]) for b in got] == [8, 8, 8, 8, 8, 5] * 2
    assert placed == [PLACED] * 12 and loader.stats["gathered_batches"] == 12
    for a, b in zip(got, want, strict=True):
        _same(a, b)
        assert a["blob"].dtype == torch.uint8 and a["emb"].dtype == torch.float32
        i = [int(k[1:]) for k in a["__key__"]]
        assert [r.numpy().tobytes() for r in a["blob"]] == [_blob(k) for k in i]
        assert np.array_equal(a["emb"].numpy(), np.stack([_emb(k) for k in i]))
        assert a["label"].tolist() == i and [m["i"] for m in a["meta"]] == i
    if shuffle:
        assert [b["__key__"] for b in got[:6]] != [b["__key__"] for b in got[6:]]


def test_placed_bytes_never_pass_through_the_read_buffer(root):
    """The read buffer keeps its layout with holes where the placed bytes would be (a reused
    block's old bytes stay there); restore() puts the file's bytes back."""
    ds = create_loader(root, "train", batch_size=8).dataset_obj
    pool = BufferPool()
    ids = [np.array([3, 20, 1, 40, 2]), np.array([17, 0])]  # two batches, three shards
    lent = pool.lease(2**20)
    lent[:] = 0xAB
    del lent  # back in the pool: the read below gets this block
    raws = ds.reader.read(ids, pool, place=True)
    assert pool.reused == 1 and all(set(r.placed) == PLACED for r in raws)
    shards = Manifest.load(root).split("train").shards
    for raw, batch in zip(raws, ids, strict=True):
        blob, emb = raw.placed["blob"], raw.placed["emb"]
        assert [r.tobytes() for r in blob.rows] == [_blob(int(i)) for i in batch]
        assert np.array_equal(emb.rows.view(np.float32), np.stack([_emb(int(i)) for i in batch]))
        for p in (blob, emb):
            for a in p.at.tolist():
                assert (raw.buf[a : a + p.rows.shape[1]] == 0xAB).all()
        restore(raw.buf, raw.placed)
        for j in range(len(batch)):
            data = _file(root, shards[raw.shard[j]])
            a, b = int(raw.start[j]), int(raw.stop[j])
            assert raw.buf[a:b].tobytes() == data[a + raw.base[j] : b + raw.base[j]]


def _file(root: str, shard: ShardInfo) -> bytes:
    return Path(root, shard.path).read_bytes()


def test_a_sample_twice_in_a_read_is_not_placed_and_still_right(root):
    ds = create_loader(root, "train", batch_size=8).dataset_obj
    (raw,) = ds.reader.read([np.array([5, 6, 5, 30])], BufferPool(), place=True)
    assert raw.placed == {}
    cols = ds.columnar.decode(raw, 0, None)
    assert cols.columns["__key__"] == ["s00005", "s00006", "s00005", "s00030"]
    assert [r.tobytes() for r in cols.columns["blob"]] == [_blob(i) for i in (5, 6, 5, 30)]


def test_a_kept_batch_is_never_overwritten_and_dropped_ones_are_reused(root):
    loader = create_loader(root, "train", batch_size=8, seed=1, drop_last=False)
    loader.dataset_obj.readahead_batches = 1
    pool = loader.dataset_obj.reader.placement.pool
    it = iter(loader)
    kept = next(it)
    want = [_blob(int(k[1:])) for k in kept["__key__"]]
    for later in it:  # each later batch dropped as the next one comes
        assert later["blob"].shape[1] == BLOB
    del later
    assert [r.numpy().tobytes() for r in kept["blob"]] == want
    assert pool.reused > 0
    again = [b["blob"][:, :3].clone() for b in loader]  # a second pass reuses the blocks
    assert len(again) == 6 and [r.numpy().tobytes() for r in kept["blob"]] == want


def _corrupt(tmp_path, patch):
    """A copy of the dataset whose first shard is ``patch(data, idx)``-ed; (root, shard)."""
    rows = [
        {"__key__": f"s{i:05d}", "blob.bin": _blob(i), "emb": _emb(i), "label": i}
        for i in range(16)
    ]
    out = str(tmp_path / "c")
    build_shards(rows, out, schema={"blob": {"dtype": "uint8"}})
    shard = Manifest.load(out).split("train").shards[0]
    path = f"{out}/{shard.path}"
    data = bytearray(open(path, "rb").read())
    patch(data, np.fromfile(f"{out}/{shard.idx_path}", dtype="<u8").astype(np.int64))
    open(path, "wb").write(bytes(data))
    return out, shard


def _header(data, idx, i, ext):
    (m,) = [
        m for m in iter_members(bytes(data), int(idx[i]), int(idx[i + 1])) if m.name.endswith(ext)
    ]
    return m.data_offset - BLOCK


@pytest.mark.parametrize("ext", ["blob.bin", "emb.npy"])
def test_a_corrupt_placed_member_header_is_the_parsers_error(tmp_path, ext, seen):
    at = {}

    def flip(data, idx):
        at["header"] = _header(data, idx, 6, ext)
        data[at["header"] + 140] ^= 0x01  # the mtime: name, size and data intact

    root, shard = _corrupt(tmp_path, flip)
    expected = rf"{re.escape(shard.path)} at byte {at['header']}: corrupt tar header"
    kw = {"batch_size": 16, "shuffle": False, "drop_last": False}
    with pytest.raises(ShardFormatError, match=expected):
        list(create_loader(root, "train", **kw))
    assert seen == [PLACED]
    loader = create_loader(root, "train", on_error="skip", **kw)
    (batch,) = list(loader)  # the others decoded from the restored bytes, by the row decoder
    keep = [i for i in range(16) if i != 6]
    assert batch["__key__"] == [f"s{i:05d}" for i in keep]
    assert [r.numpy().tobytes() for r in batch["blob"]] == [_blob(i) for i in keep]
    assert np.array_equal(batch["emb"].numpy(), np.stack([_emb(i) for i in keep]))
    assert loader.stats["skipped_samples"] == 1 and loader.stats["gathered_batches"] == 0


def test_a_layout_that_lies_about_a_placed_field_names_shard_key_and_field(tmp_path, seen):
    root, shard = _corrupt(tmp_path, lambda data, idx: None)
    m = Manifest.load(root)
    first = m.split("train").shards[0]
    off, size = first.layout["blob.bin"]
    first.layout["blob.bin"] = [off + BLOCK, size]  # inside the sample: placed from there
    os.unlink(f"{root}/manifest.json")
    m.save(root)
    expected = (
        rf"{re.escape(shard.path)}: sample 's00000', field 'blob': the manifest's layout puts "
        rf"the member s00000\.blob\.bin at byte {off + BLOCK} of the sample .* the manifest "
        "does not describe this shard"
    )
    loader = create_loader(root, "train", batch_size=16, shuffle=False)
    with pytest.raises(ShardFormatError, match=expected):
        list(loader)
    assert seen == [PLACED]
    (batch,) = list(create_loader(root, "train", batch_size=16, shuffle=False, gather=False))
    assert [r.numpy().tobytes() for r in batch["blob"]] == [_blob(i) for i in range(16)]


def test_preadv_all_fills_more_pieces_than_one_call_takes(tmp_path):
    path = tmp_path / "f"
    data = np.random.default_rng(0).integers(0, 256, 3 * IOV_MAX * 5, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    sink = np.zeros(len(data) - 7, dtype=np.uint8)
    rows = np.zeros((2 * IOV_MAX, 3), dtype=np.uint8)  # every 5 bytes: 2 to sink, 3 to a row
    cuts = [(5 * j + 2, memoryview(rows[j])) for j in range(2 * IOV_MAX)]
    fd = os.open(path, os.O_RDONLY)
    try:
        pieces = split_range(memoryview(sink), cuts)
        assert len(pieces) == 4 * IOV_MAX + 1
        preadv_all(fd, pieces, 7, str(path))
        want = data[7:]
        assert np.array_equal(
            rows, np.stack([want[5 * j + 2 : 5 * j + 5] for j in range(len(rows))])
        )
        gaps = np.ones(len(sink), dtype=bool)
        for off, buf in cuts:
            gaps[off : off + len(buf)] = False
        assert np.array_equal(sink[gaps], want[gaps]) and not sink[~gaps].any()
        with pytest.raises(
            ShardFormatError, match=rf"{re.escape(str(path))}: truncated: .* {len(data)}"
        ):
            preadv_all(fd, [memoryview(bytearray(10))], len(data) - 4, str(path))
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="overlaps"):
        split_range(memoryview(sink), [(4, memoryview(rows[0])), (5, memoryview(rows[1]))])


def test_preadv_all_goes_on_after_a_short_read(tmp_path, monkeypatch):
    """A call that fills the pieces only in part (the kernel may stop short) is continued from
    the byte where it stopped, inside a piece or between pieces, until all are full."""
    from wdsloader.io import ranges

    path = tmp_path / "f"
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    real = os.preadv
    calls: list[int] = []

    def short(fd, bufs, at):  # at most 700 bytes a call
        calls.append(at)
        room = 700
        cut = []
        for b in bufs:
            cut.append(b[: min(len(b), room)])
            room -= len(cut[-1])
        return real(fd, [b for b in cut if len(b)], at)

    monkeypatch.setattr(ranges.os, "preadv", short)
    fd = os.open(path, os.O_RDONLY)
    try:
        for sizes in ([1000, 500, 1500], [300, 400, 2000], [0, 2500, 0]):
            bufs = [np.zeros(n, dtype=np.uint8) for n in sizes]
            calls.clear()
            preadv_all(fd, [memoryview(b) for b in bufs], 11, str(path))
            assert np.array_equal(np.concatenate(bufs), data[11 : 11 + sum(sizes)])
            assert calls == [11 + 700 * k for k in range(-(-sum(sizes) // 700))]
        with pytest.raises(ShardFormatError, match="truncated"):
            preadv_all(fd, [memoryview(bytearray(900)), memoryview(bytearray(10))], 3500, "f")
    finally:
        os.close(fd)


def test_remote_reads_fill_the_cuts_by_copying(root):
    """Through fsspec (no local files) the cuts get the same bytes, one copy later."""
    from wdsloader.io.remote_store import RemoteStore

    shard = Manifest.load(root).split("train").shards[0]
    data = _file(root, shard)
    store = RemoteStore(f"file://{root}")  # the remote path, over the local filesystem
    row = np.zeros(100, dtype=np.uint8)
    joined, pos = store.read_joined(
        [(shard, 1000, 5000), (shard, 9000, 9100)], None, [[(50, memoryview(row))], []]
    )
    assert pos == [0, 4000] and bytes(joined) == data[1000:5000] + data[9000:9100]
    assert row.tobytes() == data[1050:1150]
    assert json.dumps(store.stats)  # counted as ever


def test_the_pool_hands_out_the_smallest_block_that_fits_and_keeps_the_others():
    pool = BufferPool(keep=4)
    big, small = pool.lease(100_000), pool.lease(50_000)  # a full and a last partial batch
    addresses = big.ctypes.data, small.ctypes.data
    del big, small
    again_small = pool.lease(40_000)
    again_big = pool.lease(90_000)
    assert (again_big.ctypes.data, again_small.ctypes.data) == addresses
    assert (pool.allocated, pool.reused, pool.free) == (2, 2, 0)


def test_read_buffers_with_holes_are_mapped_in_small_pages(root, tmp_path):
    assert create_loader(root, "train", batch_size=8).dataset_obj.reader.pool.small_pages
    plain = str(tmp_path / "plain")
    build_shards([{"__key__": f"k{i}", "x": np.zeros(4, np.float32)} for i in range(4)], plain)
    assert not create_loader(plain, "train", batch_size=2).dataset_obj.reader.pool.small_pages
    pool = BufferPool()
    pool.small_pages = True
    block = pool.lease(8 * 2**20)
    backing = _backing(block)
    assert isinstance(backing, mmap.mmap) and len(backing) >= 8 * 2**20


def _backing(array):
    """The object at the end of a leased array's chain: its lease, the block, its buffer."""
    chain = [array]
    while not isinstance(chain[-1], mmap.mmap) and len(chain) < 6:
        last = chain[-1]
        nxt = last.obj if isinstance(last, memoryview) else getattr(last, "base", None)
        nxt = nxt if nxt is not None else getattr(last, "block", None)
        if nxt is None:
            break
        chain.append(nxt)
    return chain[-1]


def test_batch_arrays_are_mapped_populated_and_workers_get_an_empty_pool_alike(root):
    """Batch arrays of long rows come from a pool whose large blocks are mappings of their own
    (huge pages, or faulted in when made: ``MAP_POPULATE``); a worker's copy keeps that."""
    pool = create_loader(root, "train", batch_size=8).dataset_obj.columnar.out_pool
    assert pool.populate and not pool.small_pages
    block = pool.lease(8 * 2**20)
    backing = _backing(block)
    assert isinstance(backing, mmap.mmap) and len(backing) >= 8 * 2**20
    block[:] = 7  # writable, and every byte there
    assert int(block.sum()) == 7 * 8 * 2**20
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.populate and copy.free == 0
    assert not isinstance(_backing(BufferPool().lease(8 * 2**20)), mmap.mmap)  # numpy's


def test_worker_processes_place_fields_too(root):
    """The dataset sent to DataLoader workers keeps its placement (and an empty pool)."""
    kw = {"batch_size": 8, "seed": 5, "drop_last": False, "num_workers": 2}
    loader = create_loader(root, "train", **kw)
    got = list(loader)
    assert sorted(k for b in got for k in b["__key__"]) == [f"s{i:05d}" for i in range(N)]
    for a in got:
        i = [int(k[1:]) for k in a["__key__"]]
        assert [r.numpy().tobytes() for r in a["blob"]] == [_blob(k) for k in i]
        assert np.array_equal(a["emb"].numpy(), np.stack([_emb(k) for k in i]))
    assert loader.stats["gathered_batches"] == len(got) == 6
    copy = pickle.loads(pickle.dumps(loader.dataset_obj))
    assert set(copy.reader.placement.targets) == PLACED and copy.reader.pool.small_pages
    assert copy.reader.placement.pool is copy.columnar.out_pool and copy.reader.pool.free == 0


def test_a_mix_of_sources_places_fields_too(root, tmp_path, seen):
    from wdsloader.mix import MixSource

    other = str(tmp_path / "other")
    rows = [
        {"__key__": f"t{i:05d}", "blob.bin": _blob(1000 + i), "emb": _emb(1000 + i), "label": i}
        for i in range(20)
    ]
    build_shards(rows, other, schema={"blob": {"dtype": "uint8"}}, shard_max_count=8)
    sources = [MixSource(root, weight=1.0), MixSource(other, weight=1.0)]
    loader = create_loader(
        sources, "train", 8, seed=2, fields=["blob", "emb", "label"], source_field="src"
    )
    batches = list(loader)
    # a source smaller than its quota repeats samples: a read with a sample twice is not placed
    assert batches and PLACED in seen and all(s in (PLACED, set()) for s in seen)
    for b in batches:
        ids = [int(k[1:]) + (1000 if k[0] == "t" else 0) for k in b["__key__"]]
        assert [r.numpy().tobytes() for r in b["blob"]] == [_blob(i) for i in ids]
        assert np.array_equal(b["emb"].numpy(), np.stack([_emb(i) for i in ids]))
        assert b["src"].tolist() == [int(k[0] == "t") for k in b["__key__"]]


def test_preadv_all_leaves_holes_unread_and_reads_past_them(tmp_path):
    path = tmp_path / "f"
    data = np.random.default_rng(1).integers(0, 256, 4 * IOV_MAX * 5, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    sink = np.full(len(data) - 3, 0xEE, dtype=np.uint8)
    cuts = [(5 * j + 1, Hole(3)) for j in range(2 * IOV_MAX)]  # every 5 bytes: 3 never read
    fd = os.open(path, os.O_RDONLY)
    try:
        preadv_all(fd, split_range(memoryview(sink), cuts), 3, str(path))
    finally:
        os.close(fd)
    holes = np.zeros(len(sink), dtype=bool)
    for off, hole in cuts:
        holes[off : off + len(hole)] = True
    assert (sink[holes] == 0xEE).all()  # untouched
    assert np.array_equal(sink[~holes], data[3:][~holes])  # every other byte where it belongs


def test_a_large_joined_read_is_split_over_two_threads_with_the_same_bytes(root, monkeypatch):
    from wdsloader.io import file_store
    from wdsloader.io.file_store import LocalStore

    shard = Manifest.load(root).split("train").shards[0]
    data = _file(root, shard)
    ran: list[tuple[int, str]] = []
    real = file_store.preadv_all

    def recorded(fd, pieces, start, name, url=str):
        ran.append((start, threading.current_thread().name))
        if start in fail:
            raise ValueError(f"job at {start}")
        real(fd, pieces, start, name, url)

    fail: set[int] = set()
    monkeypatch.setattr(file_store, "preadv_all", recorded)
    monkeypatch.setattr(file_store, "SPLIT_BYTES", 1000)
    store = LocalStore(root)
    reqs = [(shard, 1000 * j, 1000 * j + 700) for j in range(6)]
    joined, pos = store.read_joined(reqs)
    assert bytes(joined) == b"".join(data[s:e] for _, s, e in reqs)
    by_thread = {s: t for s, t in ran}
    assert {by_thread[s] for _, s, _ in reqs[:3]} == {"wdsloader-fetch_0"}  # the first half
    assert {by_thread[s] for _, s, _ in reqs[3:]} == {threading.current_thread().name}
    # both halves fail: the first half's error, raised once both halves are over
    ran.clear()
    fail.update({2000, 3000})
    with pytest.raises(ValueError, match="^job at 2000$"):
        store.read_joined(reqs)
    assert sorted(s for s, _ in ran) == [0, 1000, 2000, 3000]
    store.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("wdsloader-fetch")]


def _vm_flags(address: int) -> list[str]:
    """The kernel's flags of the mapping that holds ``address`` (``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if span:
                inside = int(span[1], 16) <= address < int(span[2], 16)
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_large_batch_arrays_are_advised_huge_pages_where_the_system_has_them(monkeypatch):
    """A batch array of 4 MiB or more is private memory advised ``MADV_HUGEPAGE`` and starts
    on a huge-page boundary (a 40 MiB array: 20 page faults, not 10,240); where the system has
    no transparent huge pages it is populated when made, as before."""
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(thp) or "[never]" in open(thp).read():
        pytest.skip("no transparent huge pages here")
    pool = BufferPool(keep=2, populate=True)
    block = pool.lease(8 * 2**20 + 5)
    flags = _vm_flags(block.ctypes.data)
    assert "hg" in flags and "sh" not in flags  # shared memory takes no THP advice
    assert block.ctypes.data % (2 * 2**20) == 0 and len(block) == 8 * 2**20 + 5
    block[:] = 3
    assert int(block.sum()) == 3 * (8 * 2**20 + 5)
    address = block.ctypes.data
    del block
    assert pool.lease(8 * 2**20).ctypes.data == address  # the ring: the same block again
    monkeypatch.setattr(buffers, "huge_pages", lambda: False)
    plain = BufferPool(populate=True).lease(8 * 2**20)
    assert "hg" not in _vm_flags(plain.ctypes.data)
    assert isinstance(_backing(plain), mmap.mmap)  # MAP_POPULATE


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_process_never_writes_into_the_parents_pooled_buffers():
    """A free block of a pool (read buffers with holes, batch arrays) that a forked process
    (a DataLoader worker) leases and fills is its own copy: the parent's bytes stay."""
    for pool in (BufferPool(keep=2, small_pages=True), BufferPool(keep=2, populate=True)):
        block = pool.lease(8 * 2**20)
        block[:] = 1
        address = block.ctypes.data
        del block  # free in the pool, inherited by the child
        pid = os.fork()
        if pid == 0:  # the child: lease the same block, overwrite it, report, never return
            code = 4
            try:
                got = pool.lease(8 * 2**20)
                got[:] = 9
                code = 0 if got.ctypes.data == address else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        again = pool.lease(8 * 2**20)
        assert again.ctypes.data == address
        assert int(again.min()) == int(again.max()) == 1  # nothing of the child's 9s
