"""The examples users copy must run (the DDP example is exercised by tests/test_ddp.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_and_resumes_exactly(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--out",
            str(tmp_path / "o"),
            "--samples",
            "600",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "built 600 samples" in out
    assert "identical to an uninterrupted epoch: True" in out
    assert (tmp_path / "o" / "dataset" / "manifest.json").exists()
