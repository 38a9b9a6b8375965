"""The examples users copy must run (the DDP example is exercised by tests/test_ddp.py)."""

from __future__ import annotations

import pytest

from tests.examples_util import run_example

pytestmark = pytest.mark.slow  # runs an example script in its own processes


def test_demo_runs_and_resumes_exactly(tmp_path):
    out = run_example("demo.py", "--out", str(tmp_path / "o"), "--samples", "600", "--workers", "2")
    assert "built 600 samples" in out
    assert "identical to an uninterrupted epoch: True" in out
    assert (tmp_path / "o" / "dataset" / "manifest.json").exists()
