"""examples/mixing.py runs in its small mode: exact quotas per epoch and an exact resume."""

from __future__ import annotations

import re

import pytest

from tests.examples_util import run_example

pytestmark = pytest.mark.slow  # runs an example script in its own processes


def test_mixing_example_small(tmp_path):
    out = run_example("mixing.py", "--small", "--out", str(tmp_path))
    assert "built 2460 samples: web 2000, code 400, curated 60" in out
    # train drops the last partial batch: 2000 // 16 + 400 // 16 + 60 // 16 = 125 + 25 + 3
    assert "153 steps per epoch" in out
    assert "identical to an uninterrupted run: True" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+[01]\s+\w+\s+\d", line)]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (e, name, steps, steps)  # steps taken == the largest-remainder quota (91.8, 45.9, 15.3)
        for e in ("0", "1")
        for name, steps in (("web", "92"), ("code", "46"), ("curated", "15"))
    ]
    assert [r[6] for r in rows[:3]] == ["0.74", "1.84", "5.00"]  # the short ones cycle
    # the sample-level mix: exact quotas of 2448 samples (153 batches of 16), exact resume
    assert "sample-level checkpoint after 76 batches, resumed: True" in out
    sample = [line.split() for line in out.splitlines() if line.startswith("sample ")]
    assert [(r[1], r[2], r[3], r[4]) for r in sample] == [
        (e, name, q, q)  # samples == the largest-remainder quota (1468.8, 734.4, 244.8)
        for e in ("0", "1")
        for name, q in (("web", "1469"), ("code", "734"), ("curated", "245"))
    ]
    assert [r[7] for r in sample[:3]] == ["0.73", "1.83", "4.08"]  # curated repeated ~4 times
