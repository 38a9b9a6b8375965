"""The read path's parts: the buffer pool's ownership (a buffer is never reused while anything
made from it can still be seen), the columnar decoder's "not gatherable" answer, and a decoder
that raises on the columnar path being an error, never a silent re-read by the row path."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.decode import codecs, registry
from wdsloader.decode.batch import Columns, NotGatherable
from wdsloader.errors import DecodeError
from wdsloader.io.buffers import BufferPool
from wdsloader.stream import reader as reader_module
from wdsloader.stream.ahead import DECODE_AHEAD

COUNTS = [24, 16]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


@pytest.fixture
def json_decoder():
    """Swap the registered ``json`` decoder for the test; restore the default after it."""
    original = registry.get_decoder("json")

    def swap(fn):
        registry.register_decoder("json", fn, replace=True)

    yield swap
    registry.register_decoder("json", original, replace=True)


def as_view(buf):
    """A decoder whose value is a view of the read bytes (no copy)."""
    return np.frombuffer(buf, dtype=np.uint8)


class FailsFirstCall:
    """A decoder with a bug that shows on its first call only: the row path, called after it,
    would decode the same member without error."""

    def __init__(self):
        self.calls = 0

    def __call__(self, buf):
        self.calls += 1
        if self.calls == 1:
            raise ValueError("decoder bug")
        return json.loads(bytes(buf))


def as_list(samples):
    return samples


def meta_bytes(i: int, shard: int) -> bytes:
    return json.dumps({"i": i, "shard": shard}).encode()


class CountingPool(BufferPool):
    made: list[BufferPool] = []

    def __init__(self, keep: int = 2) -> None:
        super().__init__(keep)
        CountingPool.made.append(self)


# -- the buffer pool -------------------------------------------------------------------------


def test_a_leased_buffer_returns_only_when_nothing_made_from_it_is_left():
    pool = BufferPool()
    a = pool.lease(100)
    a[:] = 7
    address = a.ctypes.data
    slice_view = memoryview(a)[10:20]  # a memoryview slice: no reference to ``a`` itself
    array_view = np.frombuffer(a[50:60], dtype=np.uint8)
    del a
    assert pool.free == 0 and bytes(slice_view) == b"\x07" * 10
    del slice_view
    assert pool.free == 0 and array_view.tolist() == [7] * 10
    del array_view
    assert pool.free == 1
    b = pool.lease(80)  # smaller fits: the same block again
    assert b.ctypes.data == address and (pool.allocated, pool.reused) == (1, 1)
    c = pool.lease(80)  # the block is out: a new one
    assert c.ctypes.data != address and pool.allocated == 2
    del b, c
    assert pool.free == 2
    d = pool.lease(1000)  # too small blocks are dropped, not handed out
    assert len(d) == 1000 and pool.free == 0 and pool.allocated == 3


def test_a_batch_kept_alive_is_not_overwritten_by_later_reads(ds, json_decoder, monkeypatch):
    """Batch N holds views of its read buffer (a decoder that does not copy); reading batches
    N+1..N+3 into pooled buffers leaves its values unchanged."""
    json_decoder(as_view)
    monkeypatch.setattr(reader_module, "BufferPool", CountingPool)
    CountingPool.made.clear()
    loader = create_loader(ds, "train", batch_size=4, shuffle=False, collate_fn=as_list)
    loader.dataset_obj.readahead_batches = 1  # a buffer per batch: reuse as soon as possible
    it = iter(loader)
    kept = next(it)
    views = [s["meta"] for s in kept]
    assert all(isinstance(v, np.ndarray) and not v.flags.owndata for v in views)
    for _ in range(3):
        later = next(it)
        assert [s["meta"].tobytes() for s in later]  # decoded, then dropped
        del later
    assert [v.tobytes() for v in views] == [meta_bytes(i, 0) for i in range(4)]
    assert [s["__key__"] for s in kept] == [f"train{i:07d}" for i in range(4)]
    # batches are decoded ahead on a thread at num_workers=0: the counters may be up to
    # DECODE_AHEAD + 1 batches past the loop's
    assert 4 <= loader.stats["gathered_batches"] <= 4 + DECODE_AHEAD + 1
    (pool,) = CountingPool.made
    # the batches dropped gave their buffers back, and later reads reused them
    rest = list(it)
    assert len(rest) == sum(COUNTS) // 4 - 4 and pool.reused > 0
    assert [v.tobytes() for v in views] == [meta_bytes(i, 0) for i in range(4)]


def test_buffers_are_reused_when_batches_are_copies(ds, monkeypatch):
    monkeypatch.setattr(reader_module, "BufferPool", CountingPool)
    CountingPool.made.clear()
    loader = create_loader(ds, "train", batch_size=2, shuffle=False)
    loader.dataset_obj.readahead_batches = 1
    batches = [b["vec"] for b in loader]
    assert len(batches) == sum(COUNTS) // 2
    (pool,) = CountingPool.made
    # one buffer being decoded, one being read: every other read reuses one
    assert pool.allocated == 2 and pool.reused == len(batches) - 2
    expected = np.arange(sum(COUNTS) * 10, dtype=np.float32).reshape(-1, 10)[:, :4]
    assert np.array_equal(np.concatenate([b.numpy() for b in batches]), expected)


class PlannedBatches(Sequence):
    """``n`` one-sample batches that record which ones were asked for (as a plan computes a
    batch only when indexed)."""

    def __init__(self, n: int) -> None:
        self.n, self.asked = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(self.n)[index]]
        self.asked.append(index)
        return np.array([index], dtype=np.int64)


def test_the_read_ahead_asks_the_plan_for_one_group_ahead_only(ds):
    reader = create_loader(ds, "train", batch_size=1).dataset_obj.reader
    reader.read = lambda group, pool=None, place=False, prefetch=None: [int(b[0]) for b in group]
    batches = PlannedBatches(10**5)
    ahead = reader.read_ahead(batches, 4)
    try:
        assert ahead.next_group() == [0]  # locally the first batch comes on its own
        assert sorted(batches.asked) == list(range(5))  # and the next group is being read
        assert ahead.next_group() == [1, 2, 3, 4]
        assert sorted(batches.asked) == list(range(9))
    finally:
        ahead.close()
    ahead = reader.read_ahead(PlannedBatches(6), 4)
    groups = [ahead.next_group() for _ in range(4)]
    ahead.close()
    assert groups == [[0], [1, 2, 3, 4], [5], None]


def test_a_local_read_group_of_large_samples_holds_at_most_32_mib(ds):
    """Each batch in flight holds batch arrays of its own: groups of a window's batches of
    large samples held ~18 of them, each faulted in anew on an epoch's first pass."""
    reader = create_loader(ds, "train", batch_size=1).dataset_obj.reader
    reader.read = lambda group, pool=None, place=False, prefetch=None: [int(b[0]) for b in group]
    reader.sample_bytes = 12 << 20  # a batch of one sample: 12 MiB, two make a group
    ahead = reader.read_ahead(PlannedBatches(6), 4)
    groups = [ahead.next_group() for _ in range(5)]
    ahead.close()
    assert groups == [[0], [1, 2], [3, 4], [5], None]
    reader.sample_bytes = 40 << 20  # larger than the cap: one batch a group
    ahead = reader.read_ahead(PlannedBatches(3), 4)
    groups = [ahead.next_group() for _ in range(4)]
    ahead.close()
    assert groups == [[0], [1], [2], None]


# -- the columnar decoder ---------------------------------------------------------------------


def test_a_corrupt_first_header_is_not_gatherable_and_says_why(ds):
    dataset = create_loader(ds, "train", batch_size=4, shuffle=False).dataset_obj
    assert dataset.columnar is not None
    batch = np.arange(4, dtype=np.int64)
    (raw,) = dataset.reader.read([batch])
    decoded = dataset.columnar.decode(raw, 0, None)
    assert isinstance(decoded, Columns) and decoded.columns["__key__"][0] == "train0000000"
    assert not decoded.errors
    raw.buf[int(raw.start[1]) + 200] ^= 0xFF  # inside the name/mode fields: checksum fails
    verdict = dataset.columnar.decode(raw, 0, None)
    assert verdict == NotGatherable("a first header is not a plain ustar header of KEY.EXT")


def test_a_decoder_error_on_the_columnar_path_is_raised(ds, json_decoder):
    json_decoder(FailsFirstCall())
    loader = create_loader(ds, "train", batch_size=4, shuffle=False)
    assert loader.dataset_obj.columnar is not None
    with pytest.raises(
        DecodeError,
        match=(
            r"shard-000000\.tar: sample 'train0000000', field 'meta' \(member "
            r"train0000000\.meta\.json\): cannot decode: ValueError: decoder bug "
            r"\(sample #0 of .*shard-000000\.tar\)$"
        ),
    ):
        next(iter(loader))


def test_a_decoder_error_on_the_columnar_path_skips_its_sample(ds, json_decoder):
    json_decoder(FailsFirstCall())
    loader = create_loader(ds, "train", batch_size=4, shuffle=False, on_error="skip")
    batches = list(loader)
    assert len(batches) == sum(COUNTS) // 4
    assert batches[0]["__key__"] == ["train0000001", "train0000002", "train0000003"]
    assert batches[0]["vec"].tolist() == [[i * 10 + k for k in range(4)] for i in (1, 2, 3)]
    assert [m["i"] for m in batches[0]["meta"]] == [1, 2, 3]
    stats = loader.stats
    assert stats["skipped_samples"] == 1 and stats["gathered_batches"] == len(batches)


def test_a_custom_npy_decoder_is_not_bypassed_by_gathering(ds):
    def doubled(buf):
        return codecs.decode_npy(buf) * 2

    original = registry.get_decoder("npy")
    registry.register_decoder("npy", doubled, replace=True)
    try:
        loader = create_loader(ds, "train", batch_size=4, shuffle=False, fields=["vec"])
        (first, *_) = list(loader)
    finally:
        registry.register_decoder("npy", original, replace=True)
    assert first["vec"].tolist() == [[2 * (i * 10 + k) for k in range(4)] for i in range(4)]
    assert loader.dataset_obj.columnar is None and loader.stats["gathered_batches"] == 0


def test_names_moved_out_of_codecs_stay_importable_there():
    from wdsloader.decode import parse
    from wdsloader.decode.codecs import SampleDecoder, get_decoder, parse_sample, register_decoder

    assert SampleDecoder is registry.SampleDecoder and parse_sample is parse.parse_sample
    assert (get_decoder, register_decoder) == (registry.get_decoder, registry.register_decoder)
    assert codecs._REGISTRY is registry._REGISTRY
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        codecs.nope  # noqa: B018
