"""examples/hf_text_lm.py runs in its small mode and its output holds what it claims."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_hf_text_lm_loss_falls():
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hf_text_lm.py"), "--small"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "400 texts" in out
    assert re.search(r"23 train / 3 val batches", out), out
    assert "pad labels all -100: True" in out
    losses = [float(x) for x in re.findall(r"val loss (\d+\.\d+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert "val loss fell: True" in out
