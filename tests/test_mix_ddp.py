"""MultiDataLoader over create_loader's loaders under real DDP: torchrun launches 2 CPU processes
(gloo); every rank steps the same number of times, and a state saved mid-epoch resumes exactly on
new loaders.

Its ``scenario`` runs under torchrun in the launch that the tests under DDP share
(tests/ddp_launch.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

COUNTS = {"web": [40], "code": [100, 57], "tiny": [13]}  # per dataset: samples per shard
BATCH = 4
WEIGHTS = [0.6, 0.3, 0.1]
STOP = (1, 9)  # epoch, step: where the interrupted run saves its state (then resumed afresh)
pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------- the torchrun script


def _build(data: Path):
    from wdsloader import create_loader
    from wdsloader.mix import MultiDataLoader, MultiDataLoaderConfig

    loaders = [
        create_loader(
            str(data / name),
            "train",
            BATCH,
            distributed=True,
            seed=3,
            num_workers=1 if name == "code" else 0,
        )  # fmt: skip
        for name in COUNTS
    ]
    config = MultiDataLoaderConfig(
        sampling_strategy="weighted", dataloader_weights=WEIGHTS, dataloader_names=list(COUNTS)
    )
    return MultiDataLoader(loaders, config)


def _play(mdl, epochs: int, stop: tuple[int, int] | None = None) -> dict:
    seen: dict[int, list] = {}
    for _ in range(mdl.epoch, epochs):
        epoch = mdl.epoch
        seen[epoch] = []
        for step in mdl:
            seen[epoch].append([step.name, step.batch["__key__"]])
            if stop == (epoch, len(seen[epoch])):
                return {"seen": seen, "state": mdl.state_dict(), "len": len(mdl)}
    return {"seen": seen, "len": len(mdl)}


PHASES = ("first",)  # the resume is played in the same processes, on new loaders


def prepare(folder: Path) -> None:
    from tests.dataset_factory import write_dataset

    for name, counts in COUNTS.items():
        write_dataset(str(folder / name), {"train": counts})


def scenario(folder: Path, phase: str) -> None:
    """This rank's part (in the process group torchrun started); rank 0 writes every rank's
    report to ``folder/{phase}.json``."""
    import torch.distributed as dist

    report = {"full": _play(_build(folder), epochs=2)}
    report["first"] = _play(_build(folder), epochs=2, stop=STOP)
    # new loaders (new worker pools), the saved state through JSON as a checkpoint would be
    mdl = _build(folder)
    mdl.load_state_dict(json.loads(json.dumps(report["first"]["state"])))
    report["second"] = _play(mdl, epochs=2)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if dist.get_rank() == 0:
        (folder / f"{phase}.json").write_text(json.dumps(gathered))


# ------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def runs(ddp_reports):
    return ddp_reports[__name__]


def test_every_rank_steps_the_same_number_of_times_with_exact_quotas(runs):
    # per rank and epoch: web 40 // 8 = 5 batches, code 157 // 8 = 19, tiny 13 // 8 = 1;
    # SUM_OF_LENGTHS = 25 steps; quotas of 0.6/0.3/0.1 over 25: 15/7.5/2.5 -> 15, 8, 2
    for epoch in ("0", "1"):
        steps = [len(r["full"]["seen"][epoch]) for r in runs]
        assert steps == [25, 25] and runs[0]["full"]["len"] == 25
        for r in runs:
            names = Counter(name for name, _ in r["full"]["seen"][epoch])
            assert names == {"web": 15, "code": 8, "tiny": 2}
    # the same schedule on both ranks, over disjoint samples within a loader's pass
    a, b = (r["full"]["seen"]["0"] for r in runs)
    assert [n for n, _ in a] == [n for n, _ in b]
    code = [{k for n, keys in run for k in keys if n == "code"} for run in (a, b)]
    assert len(code[0]) == len(code[1]) == 8 * BATCH and not code[0] & code[1]
    # web (5 batches a pass, 40 samples over both ranks) cycles: 15 steps are 3 whole passes,
    # each a new epoch of its loader: over both ranks every web sample comes exactly 3 times
    web = Counter(k for run in (a, b) for n, keys in run for k in keys if n == "web")
    assert len(web) == 40 and set(web.values()) == {3}


def test_a_mid_epoch_state_resumes_exactly_on_new_loaders(runs):
    epoch, step = STOP
    for r in runs:
        head = r["first"]["seen"][str(epoch)]
        tail = r["second"]["seen"][str(epoch)]
        assert len(head) == step and len(tail) == 25 - step
        assert head + tail == r["full"]["seen"][str(epoch)]
        state = r["first"]["state"]
        assert state["epoch"] == epoch and state["position"] == step
        assert all(row["state"]["format"] == "wdsloader.stream.loader" for row in state["loaders"])
