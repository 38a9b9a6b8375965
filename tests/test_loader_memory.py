"""Memory over an epoch is bounded by the shuffle window, not by the number of samples."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from build_shards import build_shards
from wdsloader import create_loader

DIM = 1024  # 4 KiB per sample
WINDOW = 128  # samples a worker shuffles within (and holds in memory)
N = 1_000


def _peak_epoch_bytes(root, window: int) -> tuple[int, int]:
    """``(samples read, tracemalloc peak over one epoch)``; numpy reports its buffers too."""
    loader = create_loader(
        root, "train", batch_size=32, num_workers=0, seed=0, shuffle_window=window
    )
    gc.collect()
    tracemalloc.start()
    try:
        seen = sum(len(batch["vec"]) for batch in loader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return seen, peak


def _peaks(tmp_path, window: int | None) -> dict[int, int]:
    """The epoch's peak at ``N`` and ``4 N`` samples (``window`` None: the whole split)."""
    peaks = {}
    for size in (N, 4 * N):
        items = [{"__key__": f"k{i:06d}", "vec": np.full(DIM, i, np.float32)} for i in range(size)]
        build_shards(items, tmp_path / str(size), shard_max_count=200)
        del items
        root, w = tmp_path / str(size), window or size
        _peak_epoch_bytes(root, w)  # first use: lazy imports, caches
        seen, peaks[size] = _peak_epoch_bytes(root, w)
        assert seen == size // 32 * 32  # drop_last in train
    return peaks


def test_epoch_memory_does_not_grow_with_the_samples(tmp_path):
    peaks = _peaks(tmp_path, WINDOW)
    # the plan's arrays grow by a few int64 per sample; the samples' bytes (4 KiB each) must
    # not: holding even 1 in 20 of the extra 3 N samples would add > 600 KB
    growth = peaks[4 * N] - peaks[N]
    assert growth < 3 * N * 64, (peaks, growth)
    assert peaks[N] < 8 * WINDOW * DIM * 4, peaks  # a few windows of samples


def test_the_memory_check_sees_a_window_as_big_as_the_split(tmp_path):
    # the same measure fails when what is held grows with the samples (here: by design)
    peaks = _peaks(tmp_path, None)
    assert peaks[4 * N] - peaks[N] > 3 * N * DIM * 4 // 2, peaks
