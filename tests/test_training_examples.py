"""examples/hf_text_lm.py and examples/packed_lm.py run in their small mode and their output holds what they claim."""

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


def test_packed_lm_loss_falls_with_fewer_pad_tokens():
    pytest.importorskip("tokenizers")
    out = run_example("packed_lm.py", "--small")
    packed, unpacked = (
        float(x) for x in re.findall(r"packed (\d+\.\d+)% vs unpacked (\d+\.\d+)%", out)[0]
    )
    assert packed < unpacked / 4, out
    first, last = (
        float(x) for x in re.findall(r"loss fell: (\d+\.\d+) -> (\d+\.\d+) \(yes\)", out)[0]
    )
    assert last < first * 0.6, out
