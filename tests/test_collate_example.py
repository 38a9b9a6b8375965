"""examples/vision_registry.py runs in its small mode: the vision collator picked by
TaskSpec.vision_tiny() feeds a tiny CNN that learns the synthetic classes."""

from __future__ import annotations

import re

import pytest

from tests.examples_util import run_example

pytestmark = pytest.mark.slow  # runs an example script in its own processes


def test_vision_registry_small(tmp_path):
    out = run_example("vision_registry.py", "--small", "--out", str(tmp_path / "o"))
    assert "built 400 samples" in out and "(images stored as png)" in out
    assert "collator for vision_tiny (vision): VisionCollator(stats=((0.485, 0.456, 0.406)" in out
    assert "batch: pixel_values (32, 3, 32, 32) torch.float32" in out
    assert "labels torch.int64" in out
    first, last = map(
        float, re.search(r"train loss: first ([\d.]+) -> last ([\d.]+)", out).groups()
    )
    assert last < first / 2, out
    before = float(re.search(r"val accuracy before training: ([\d.]+)", out).group(1))
    after = float(re.search(r"val accuracy after training: ([\d.]+)", out).group(1))
    assert before < 0.5 and after >= 0.9, out
