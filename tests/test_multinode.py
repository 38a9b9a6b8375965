"""Many ranks in practice: a 2 DP x 2 TP job (a DeviceMesh) where both ranks of a tensor-parallel
group get identical batches, and two torchrun "nodes" on this machine reading a dataset on S3
(moto on loopback) that step equally, see each sample once, and resume on 3 ranks exactly."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import new_bucket
from tests.dataset_factory import write_dataset
from tests.torchrun_harness import ROOT, Launch, start_torchrun
from wdsloader import create_loader
from wdsloader.plan import PlanConfig, Resume, rank_batches

SCRIPT = str(ROOT / "tests" / "distributed_run.py")
COUNTS = [37, 25, 41, 30, 19]  # 152 samples
pytestmark = pytest.mark.slow


def launch(*torchrun_args: str, nproc: int, script_args: list[str]) -> Launch:
    return start_torchrun(
        SCRIPT, *script_args, nproc=nproc, launcher_args=torchrun_args, timeout=240
    )


def wait(*launches: Launch) -> None:
    failures = []
    for launch in launches:  # wait for every launch (each ends by its timeout) before failing
        try:
            launch.wait()
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_rank_of_a_tensor_parallel_group_gets_the_same_batches(tmp_path):
    data = tmp_path / "ds"
    write_dataset(str(data), {"train": COUNTS})
    out = tmp_path / "out"
    out.mkdir()
    args = ["--data", str(data), "--out", str(out), "--mesh", "--num-workers", "2"]
    wait(launch("--standalone", nproc=4, script_args=args))
    got = reports(out, 4)
    # init_device_mesh lays ranks out row-major: dp = rank // 2, tp = rank % 2
    assert [r["plan_rank"] for r in got] == [0, 0, 1, 1]
    assert got[0]["keys"] == got[1]["keys"] and got[2]["keys"] == got[3]["keys"]
    assert len(got[0]["keys"]) == len(got[2]["keys"]) == got[0]["len"] == 152 // 8
    dp0 = [k for b in got[0]["keys"] for k in b]
    dp1 = [k for b in got[2]["keys"] for k in b]
    assert len(set(dp0 + dp1)) == len(dp0) + len(dp1) == 152  # two DP ranks: every sample once


class FakeMesh:
    """What create_loader reads of a DeviceMesh (rank 3 of a 2 x 4 mesh "dp" x "tp")."""

    mesh_dim_names = ("dp", "tp")

    def get_local_rank(self, dim: str) -> int:
        return {"dp": 0, "tp": 3}[dim]

    def size(self, dim: int) -> int:
        return (2, 4)[dim]


def test_data_parallel_options_that_contradict_or_go_unused_are_refused(tmp_path):
    data = str(tmp_path / "ds")
    write_dataset(data, {"train": COUNTS})
    with pytest.raises(ValueError, match="device_mesh gives the data-parallel rank and size"):
        create_loader(data, "train", batch_size=4, device_mesh=FakeMesh(), rank=0, world_size=2)
    with pytest.raises(ValueError, match="device_mesh gives the data-parallel rank and size"):
        create_loader(data, "train", batch_size=4, device_mesh=FakeMesh(), distributed=True)
    with pytest.raises(ValueError, match=r"dp_dim='data' is not a dimension of device_mesh"):
        create_loader(data, "train", batch_size=4, device_mesh=FakeMesh(), dp_dim="data")
    with pytest.raises(ValueError, match=r"dp_dim='dp' would be unused"):
        create_loader(data, "train", batch_size=4, dp_dim="dp")
    by_mesh = create_loader(data, "train", batch_size=4, device_mesh=FakeMesh())
    by_rank = create_loader(data, "train", batch_size=4, rank=0, world_size=2)
    assert (by_mesh.dataset_obj.rank, by_mesh.dataset_obj.config.world_size) == (0, 2)
    assert [b["__key__"] for b in by_mesh] == [b["__key__"] for b in by_rank]


def test_two_nodes_on_s3_step_equally_and_resume_on_three_ranks(s3_server, tmp_path):
    bucket, options = new_bucket(s3_server, "nodes")
    data = f"{bucket}/ds"
    write_dataset(data, {"train": COUNTS}, options)
    common = ["--data", data, "--storage-options", json.dumps(options), "--batch-size", "4"]
    port = free_port()
    rdzv = ["--nnodes=2", "--rdzv-backend=c10d"]
    rdzv += [f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=planscale"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    node_args = [*common, "--out", str(first), "--state-after", "4"]
    wait(*[launch(*rdzv, f"--node-rank={n}", nproc=2, script_args=node_args) for n in range(2)])
    resume_args = [*common, "--out", str(second), "--resume", str(first / "state.json")]
    wait(launch("--standalone", nproc=3, script_args=resume_args))

    before, after = reports(first, 4), reports(second, 3)
    assert {r["node"] for r in before} == {"0", "1"}  # two nodes of two ranks each
    # 152 samples on 4 ranks of batch 4: 9 batches each, 8 samples left out
    assert [len(r["keys"]) for r in before] == [9] * 4 and {r["len"] for r in before} == {9}
    epoch = [k for r in before for b in r["keys"] for k in b]
    assert len(set(epoch)) == len(epoch) == 144
    old, new = (PlanConfig(**r[0]["config"]) for r in (before, after))
    assert (old.world_size, new.world_size) == (4, 3)
    for r in before:  # the plan's batches, rank by rank
        ids = rank_batches(old, 0, r["rank"])
        assert r["keys"] == [[f"train{i:07d}" for i in b] for b in ids]
    # after 4 batches on 4 ranks, 88 samples remain: 3 ranks x 7 batches of 4, 4 left out
    assert [len(r["keys"]) for r in after] == [7] * 3
    assert {len(b) for r in after for b in r["keys"]} == {4}
    consumed = [k for r in before for b in r["keys"][:4] for k in b]
    delivered = [k for r in after for b in r["keys"] for k in b]
    assert len(set(consumed + delivered)) == len(consumed) + len(delivered) == 152 - 4
    for r in after:  # exactly the elastic re-plan of the 4-rank state on 3 ranks
        ids = rank_batches(new, 0, r["rank"], Resume(old, 4))
        assert r["keys"] == [[f"train{i:07d}" for i in b] for b in ids]
