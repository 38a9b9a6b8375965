"""examples/steering_curriculum.py runs in its small mode and its output holds what it claims."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.examples_util import run_example

pytestmark = pytest.mark.slow  # runs an example script in its own processes

BATCH = 64  # the example's default --batch-size (train drops fewer than one batch)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split("/")]


def test_steering_curriculum_small(tmp_path):
    out_dir = tmp_path / "o"
    out = run_example("steering_curriculum.py", "--small", "--out", str(out_dir))
    lines = out.splitlines()

    built = re.search(r"built (\d+) samples .*: train (\d+) .*questions in two splits: (\d+)", out)
    assert built, out
    assert int(built.group(1)) == 1500
    n_train = int(built.group(2))
    assert int(built.group(3)) == 0  # grouped by question: no question in two splits
    assert "first batches valid (train, val)" in out

    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["epoch"])
    rows = [line.split() for line in lines[header + 1 :] if re.match(r"^\s*\d+\s", line)]
    assert [int(r[0]) for r in rows] == [0, 1, 2], out  # --small: 3 epochs, one line each
    for r in rows:
        assert len(r) == 7, r
    train_loss = [float(r[1]) for r in rows]
    val_loss = [float(r[2]) for r in rows]
    mix = [_floats(r[4]) for r in rows]
    sched = [_floats(r[5]) for r in rows]
    val_mix = [_floats(r[6]) for r in rows]

    for m, s in zip(mix, sched, strict=True):
        assert len(m) == len(s) == 4
        assert math.isclose(sum(m), 1.0, abs_tol=0.005)
        assert math.isclose(sum(s), 1.0, abs_tol=0.005)
    # the reference schedule: P(zero) 0.5 -> 0.1, the rest shared equally
    assert sched[0] == [0.5, 0.167, 0.167, 0.167]
    assert sched[-1] == [0.1, 0.3, 0.3, 0.3]
    # what training saw follows the schedule (binomial tolerance for the samples of one epoch)
    n = n_train - BATCH
    for m, s in zip(mix, sched, strict=True):
        for seen, p in zip(m, s, strict=True):
            assert abs(seen - p) <= 4.5 * math.sqrt(p * (1 - p) / n) + 0.002, (m, s)
    # validation has steering forced to centroid
    assert all(v == [0.0, 1.0, 0.0, 0.0] for v in val_mix), val_mix
    # it learns
    assert train_loss[-1] < train_loss[0], train_loss
    assert val_loss[-1] < val_loss[0], val_loss
    assert re.search(r"^done in [\d.]+s$", lines[-1])

    manifest = json.loads((out_dir / "dataset" / "manifest.json").read_text())
    assert manifest["build"]["group_by"] == "question_id"
    curriculum = manifest["loader_defaults"]["curriculum"]
    assert list(curriculum["variants"]) == ["zero", "centroid", "keyword", "residual"]
    assert manifest["schema"]["negative_tiers"]["range"] == [1, 4]
    assert manifest["dims"] == {"D": 64, "N_neg": 8}
    assert manifest["schema"]["cluster_id"]["shape"] == []  # 0-d .npy: gathered per batch
    assert manifest["schema"]["relevance"]["range"] == [0.0, 1.0]
