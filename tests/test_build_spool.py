"""How a block of in-memory items travels to a worker: array and bytes fields through a mapped
file (not pickle), the same items coming out; how many processes a build starts."""

from __future__ import annotations

import pickle

import numpy as np

from build_shards.engines.base import BlockTask
from build_shards.engines.local import fit_workers
from build_shards.write.spool import MIN_BLOB_BYTES, SpooledItems, spool_items


def _items(n: int, blob: int) -> list[tuple[int, dict]]:
    return [
        (
            10 + i,
            {
                "vec": np.full(3, i, np.float32),
                "blob.bin": bytes([i % 256]) * (blob + i),
                "label": i,
                "tag": b"x" * i,
            },
        )
        for i in range(n)
    ]


def test_bytes_fields_go_through_the_file_and_come_back_equal():
    items = _items(20, 70_000)  # 1.4 MB of blobs: spooled; "tag" (190 bytes) stays pickled
    spooled = spool_items(items)
    assert isinstance(spooled, SpooledItems)
    assert list(spooled.blobs) == ["blob.bin"] and sorted(spooled.others) == ["label", "tag"]
    sent = pickle.dumps(spooled)
    assert len(sent) < 10_000  # the blobs are not in the pickle
    got = list(pickle.loads(sent))
    assert [i for i, _ in got] == [i for i, _ in items]
    for (_, want), (_, have) in zip(items, got, strict=True):
        assert list(have) == list(want)  # the same names in the same order
        assert type(have["blob.bin"]) is bytes and have["blob.bin"] == want["blob.bin"]
        assert have["tag"] == want["tag"] and have["label"] == want["label"]
        np.testing.assert_array_equal(have["vec"], want["vec"])


def test_small_bytes_fields_stay_pickled():
    spooled = spool_items(_items(3, 100))
    assert isinstance(spooled, SpooledItems) and not spooled.blobs
    assert 3 * 100 < MIN_BLOB_BYTES


def _ranges(n: int) -> list[BlockTask]:
    return [BlockTask(b, b * 10, b * 10 + 10) for b in range(n)]


def test_a_build_starts_no_more_processes_than_blocks():
    for blocks, workers, want in ((1, 4, 1), (3, 4, 3), (8, 4, 4), (5, 1, 1)):
        tasks, got = fit_workers(iter(_ranges(blocks)), workers)
        assert got == want and [t.block for t in tasks] == list(range(blocks))


def test_blocks_of_a_stream_are_not_looked_ahead():
    taken = []

    def stream_tasks():
        for b in range(3):
            taken.append(b)
            yield BlockTask(b, b * 10, None, [])

    tasks, got = fit_workers(stream_tasks(), 4)
    assert got == 4 and taken == [0]  # only the first block was made
    assert [t.block for t in tasks] == [0, 1, 2]
