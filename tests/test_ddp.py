"""Real DDP: torchrun launches 2 CPU processes (gloo) over 1001 samples in 7 unequal shards."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.dataset_factory import write_dataset
from tests.torchrun_harness import ROOT, run_torchrun

COUNTS = [200, 150, 180, 120, 151, 100, 100]  # 1001 samples
pytestmark = pytest.mark.slow


def torchrun(*args: str, cwd: Path) -> None:
    run_torchrun(ROOT / "examples" / "ddp_train.py", *args, cwd=cwd)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    data = tmp / "ds"
    write_dataset(str(data), {"train": COUNTS})
    common = ["--data", str(data), "--epochs", "2", "--batch-size", "16", "--num-workers", "2"]
    full = tmp / "full.json"
    torchrun(*common, "--report", str(full), cwd=tmp)
    ckpt = tmp / "ckpt.pt"
    first = tmp / "first.json"
    torchrun(
        *common, "--stop-after", "1:9", "--checkpoint", str(ckpt), "--report", str(first), cwd=tmp
    )
    second = tmp / "second.json"
    torchrun(*common, "--resume", "--checkpoint", str(ckpt), "--report", str(second), cwd=tmp)
    return [json.loads(p.read_text()) for p in (full, first, second)]


def test_every_rank_steps_the_same_and_sees_each_sample_once(ddp_runs):
    full = ddp_runs[0]
    n = sum(COUNTS)
    per_rank = -(-n // 2)  # drop_last=False: ceil(1001 / 2) = 501 samples per rank
    for epoch in ("0", "1"):
        steps = [r["steps"][epoch] for r in full]
        assert steps[0] == steps[1] == full[0]["len"] == -(-per_rank // 16)
        keys = Counter(k for r in full for k in r["seen"][epoch])
        assert set(keys) == {f"train{i:07d}" for i in range(n)}  # complete
        repeated = [k for k, c in keys.items() if c > 1]
        assert len(repeated) == 2 * per_rank - n == 1 and keys[repeated[0]] == 2  # one pad
        assert not set(full[0]["seen"][epoch]) & set(full[1]["seen"][epoch]) - set(repeated)
    assert full[0]["seen"]["0"] != full[0]["seen"]["1"]  # a new order every epoch


def test_mid_epoch_checkpoint_resumes_with_exactly_the_remaining_batches(ddp_runs):
    full, first, second = ddp_runs
    for rank in (0, 1):
        assert first[rank]["steps"]["1"] == 9
        resumed = first[rank]["seen"]["1"] + second[rank]["seen"]["1"]
        assert resumed == full[rank]["seen"]["1"]  # same keys, same order
        assert second[rank]["steps"]["1"] == full[rank]["steps"]["1"] - 9
