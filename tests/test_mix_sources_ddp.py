"""Sources mixed inside one stream under real DDP: torchrun launches 2 CPU processes (gloo) over a
three-source mix; every rank yields the same number of batches with the exact quotas, and a state
saved mid-epoch resumes exactly in a second torchrun (a new process group, new workers).

Its ``scenario`` runs under torchrun in the launches that the tests under DDP share
(tests/ddp_launch.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

COUNTS = {"web": [300, 200], "code": [120], "tiny": [13]}  # per source: samples per shard
BATCH = 8
STOP = (1, 6)  # epoch, batch: where the first run saves its state
pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------- the torchrun script


def _loader(data: Path):
    from wdsloader import create_loader
    from wdsloader.mix import MixSource

    sources = [MixSource(data / "web", weight=0.6), MixSource(data / "code", weight=0.3),
               MixSource(data / "tiny", weight=0.1)]  # fmt: skip
    return create_loader(sources, "train", BATCH, distributed=True, seed=5, num_workers=1,
                         epoch_samples=400, source_field="src", shuffle_window=32)  # fmt: skip


def _play(loader, epochs: int, stop: tuple[int, int] | None = None) -> dict:
    seen: dict[int, list] = {}
    while loader.dataset_obj.epoch < epochs:
        epoch = loader.dataset_obj.epoch
        seen[epoch] = []
        for b in loader:
            seen[epoch].append([b["src"].tolist(), b["idx"].tolist()])
            if stop == (epoch, len(seen[epoch])):
                return {"seen": seen, "state": loader.state_dict(), "len": len(loader)}
    return {"seen": seen, "len": len(loader)}


PHASES = ("first", "second")  # the second in a new process group: new processes, new workers


def prepare(folder: Path) -> None:
    from tests.dataset_factory import write_dataset

    for name, counts in COUNTS.items():
        write_dataset(str(folder / name), {"train": counts})


def scenario(folder: Path, phase: str) -> None:
    """This rank's part of ``phase`` (in the process group torchrun started); rank 0 writes
    every rank's report to ``folder/{phase}.json``."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if phase == "first":
        report = {"full": _play(_loader(folder), 2), "first": _play(_loader(folder), 2, stop=STOP)}
    else:  # a new process group: the state of this rank, from the first run's checkpoint
        states = json.loads((folder / "first.json").read_text())
        loader = _loader(folder)
        loader.load_state_dict(states[rank]["first"]["state"])
        report = {"second": _play(loader, 2)}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if rank == 0:
        (folder / f"{phase}.json").write_text(json.dumps(gathered))


# ------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def runs(ddp_reports):
    return ddp_reports[__name__]


def test_every_rank_yields_the_same_batches_with_the_exact_quotas(runs):
    for epoch in ("0", "1"):
        assert [len(r["full"]["seen"][epoch]) for r in runs] == [25, 25]  # 400 / (2 x 8)
        assert runs[0]["full"]["len"] == 25
        per_source = Counter(s for r in runs for srcs, _ in r["full"]["seen"][epoch] for s in srcs)
        assert per_source == {0: 240, 1: 120, 2: 40}  # 0.6 / 0.3 / 0.1 of 400
        # web (500) is subsampled: no sample twice in the epoch; code (120): each once
        pairs = Counter(
            (s, i) for r in runs for srcs, ids in r["full"]["seen"][epoch]
            for s, i in zip(srcs, ids, strict=True)
        )  # fmt: skip
        assert all(n == 1 for (s, _), n in pairs.items() if s in (0, 1))
        assert {n for (s, _), n in pairs.items() if s == 2} <= {3, 4}  # tiny: 40 of 13


def test_a_mid_epoch_state_resumes_exactly_in_a_new_process_group(runs):
    epoch, step = STOP
    for r in runs:
        head = r["first"]["seen"][str(epoch)]
        tail = r["second"]["seen"][str(epoch)]
        assert len(head) == step and len(tail) == 25 - step
        assert head + tail == r["full"]["seen"][str(epoch)]
        assert r["first"]["state"]["epoch"] == epoch and r["first"]["state"]["batches_done"] == step
        assert "mix" in r["first"]["state"]["fingerprint"]
