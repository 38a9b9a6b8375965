"""examples/vision_registry.py runs in its small mode: the vision collator picked by
TaskSpec.vision_tiny() feeds a tiny CNN that learns the synthetic classes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_vision_registry_small(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "vision_registry.py"),
            "--small",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
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
