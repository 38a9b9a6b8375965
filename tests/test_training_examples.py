"""examples/hf_text_lm.py runs in its small mode and its output holds what it claims."""

from __future__ import annotations

import re

import pytest

from tests.examples_util import run_example

pytestmark = pytest.mark.slow  # runs an example script in its own processes


def test_hf_text_lm_loss_falls():
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    out = run_example("hf_text_lm.py", "--small")
    assert "400 texts" in out
    assert re.search(r"23 train / 3 val batches", out), out
    assert "pad labels all -100: True" in out
    losses = [float(x) for x in re.findall(r"val loss (\d+\.\d+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert "val loss fell: True" in out
