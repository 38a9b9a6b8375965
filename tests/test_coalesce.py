"""plan.coalesce: the one range coalescer of the read path (store reads and batch reads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wdsloader.plan.coalesce import coalesce


def test_merges_touching_overlapping_and_repeated_ranges_per_key():
    runs = coalesce([1, 0, 0, 0, 1, 0], [0, 10, 0, 5, 3, 30], [3, 20, 10, 8, 9, 40])
    assert list(zip(runs.key.tolist(), runs.start.tolist(), runs.stop.tolist(), strict=True)) == [
        (0, 0, 20),
        (0, 30, 40),
        (1, 0, 9),
    ]
    assert runs.run_of.tolist() == [2, 0, 0, 0, 2, 1]


def test_a_run_ends_at_its_furthest_stop_not_its_last():
    runs = coalesce([0, 0, 0], [0, 2, 15], [12, 4, 20])  # [2, 4) lies inside [0, 12)
    assert runs.stop.tolist() == [12, 20]
    assert runs.run_of.tolist() == [0, 0, 1]


def test_empty_and_mismatched_inputs():
    assert len(coalesce([], [], []).key) == 0
    with pytest.raises(ValueError, match="2 keys, 1 starts and 1 stops"):
        coalesce([0, 1], [0], [1])


def test_huge_offsets_take_the_per_key_path():
    big = 2**61
    runs = coalesce([0, 1, 2, 2], [big, 0, 5, big], [big + 5, 9, big, big + 1])
    assert runs.stop.tolist() == [big + 5, 9, big + 1]
    assert runs.run_of.tolist() == [0, 1, 2, 2]


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 40)),
        min_size=1,
        max_size=40,
    )
)
def test_same_bytes_as_a_scan(ranges):
    keys, starts, lengths = (np.array(x) for x in zip(*ranges, strict=True))
    stops = starts + lengths
    runs = coalesce(keys, starts, stops)
    for i in range(len(keys)):  # every range lies in its run, of its key
        r = runs.run_of[i]
        assert runs.key[r] == keys[i] and runs.start[r] <= starts[i] and stops[i] <= runs.stop[r]
    for key in range(4):  # runs of one key neither overlap nor touch, and cover only ranges
        mine = np.flatnonzero(runs.key == key)
        assert (runs.start[mine][1:] > runs.stop[mine][:-1]).all()
        covered = {b for i in np.flatnonzero(keys == key) for b in range(starts[i], stops[i])}
        spans = {b for r in mine for b in range(runs.start[r], runs.stop[r])}
        assert spans == covered
