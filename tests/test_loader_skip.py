"""on_error="skip": every rank still yields len(loader) batches, resume stays exact, and
max_skipped bounds the skipping."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.dataset_factory import write_dataset
from wdsloader import SkipLimitError, create_loader

COUNTS = [12, 12]  # 24 samples, batches of 4: [0-3] [4-7] ... [20-23] unshuffled
BAD = [4, 5, 6, 7, 13]  # every sample of batch 1, one sample of batch 3


def corrupt_meta(root: Path, split: str, indices: list[int]) -> None:
    """Flip the first byte of the ``meta.json`` of the samples at these split positions (their
    JSON no longer decodes; sizes and offsets stay)."""
    for shard in sorted((root / split).glob("*.tar")):
        data = bytearray(shard.read_bytes())
        for i in indices:
            at = data.find(b'{"i": %d, "shard"' % i)
            if at >= 0:
                data[at] ^= 0xFF
        shard.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def bad_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("skip") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    corrupt_meta(root, "train", BAD)
    return str(root)


def keys(batches):
    return [list(b["__key__"]) for b in batches]


def key(i):
    return f"train{i:07d}"


def make(ds, **kw):
    kw.setdefault("shuffle", False)
    kw.setdefault("drop_last", False)
    return create_loader(ds, "train", batch_size=4, on_error="skip", **kw)


@pytest.mark.parametrize("gather", [True, False])
def test_a_batch_whose_every_sample_fails_is_refilled_not_dropped(bad_ds, gather):
    loader = make(bad_ds, gather=gather)
    got = keys(loader)
    assert len(got) == len(loader) == 6
    # batch 1 failed whole: the samples of the next batch stand in; batch 3 lost one sample
    assert got[1] == got[2] == [key(i) for i in range(8, 12)]
    assert got[3] == [key(i) for i in (12, 14, 15)]
    assert got[0] == [key(i) for i in range(4)] and got[5] == [key(i) for i in range(20, 24)]
    assert loader.stats["skipped_samples"] == len(BAD)
    assert loader.stats["skipped_batches"] == 1 and loader.stats["batches"] == 6


def test_consecutive_failed_batches_and_a_failed_last_batch(tmp_path):
    root = tmp_path / "ds"
    write_dataset(str(root), {"train": COUNTS})
    corrupt_meta(root, "train", [*range(4, 12), *range(20, 24)])  # batches 1, 2 and 5
    got = keys(make(str(root)))
    assert len(got) == 6
    assert got[1] == got[2] == got[3] == [key(i) for i in range(12, 16)]
    assert got[5] == [key(i) for i in range(4)]  # the search wraps round to the first batch


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_skipped_batches_yields_exactly_the_rest(bad_ds, workers):
    full = keys(make(bad_ds, num_workers=workers))
    assert len(full) == 6
    for k in (1, 2, 3, 4) if workers == 0 else (3,):
        first = make(bad_ds, num_workers=workers)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        del it
        resumed = make(bad_ds, num_workers=workers)
        resumed.load_state_dict(state)
        assert keys(resumed) == full[k:], k


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_yield_the_same_number_of_batches_when_one_skips(bad_ds, workers):
    counts = []
    for rank in (0, 1):
        # rank 0 holds samples 0-11: its batch of samples 4-7 fails whole
        loader = make(bad_ds, rank=rank, world_size=2, num_workers=workers)
        counts.append((len(list(loader)), len(loader)))
    assert counts[0] == counts[1] == (3, 3)


def test_max_skipped_raises_with_the_count_and_the_last_error(bad_ds):
    loader = make(bad_ds, max_skipped=3)
    with pytest.raises(
        SkipLimitError,
        match=r"4 samples skipped in this pass of rank 0 \(split 'train'\), more than "
        r"max_skipped=3; last error: sample #7 of .*shard-000000\.tar",
    ):
        list(loader)
    assert len(list(make(bad_ds, max_skipped=len(BAD)))) == 6  # the budget is per pass
    with pytest.raises(ValueError, match="max_skipped must be None or >= 0"):
        make(bad_ds, max_skipped=-1)


def test_max_skipped_reaches_workers(bad_ds):
    loader = make(bad_ds, max_skipped=2, num_workers=2)
    with pytest.raises(SkipLimitError, match=r"more than max_skipped=2; last error: sample #"):
        list(loader)


def test_a_worker_with_no_decodable_sample_raises(tmp_path, caplog):
    root = tmp_path / "ds"
    write_dataset(str(root), {"train": [5]})
    corrupt_meta(root, "train", list(range(5)))
    caplog.set_level(logging.WARNING)
    with pytest.raises(SkipLimitError, match=r"no sample of the 2 batches of worker 0"):
        list(make(str(root)))
