"""A token-weighted mix under real DDP: torchrun launches 2 CPU processes (gloo), each with a
DataLoader worker, over two sources of very different document lengths; both ranks yield the same
number of batches, each source's tokens per epoch are its share within one document, and a state
saved mid-epoch resumes exactly in a second torchrun.

Its ``scenario`` runs under torchrun in the launches that the tests under DDP share
(tests/ddp_launch.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

BATCH = 4
STOP = (1, 3)  # epoch, batch: where the first run saves its state
SCALE = {"short": 2, "long": 25}  # tokens per length unit of each source
pytestmark = pytest.mark.slow


def _len(i: int, scale: int) -> int:
    return ((i * 7919) % 13 + 1) * scale


# ----------------------------------------------------------------------- the torchrun script


def _loader(data: Path):
    from wdsloader import DecodeOptions, Mix, create_loader
    from wdsloader.mix import MixSource

    mix = Mix([MixSource(data / "short", weight=3.0), MixSource(data / "long", weight=1.0)],
              unit="tokens", epoch_tokens=4000, source_field="src")  # fmt: skip
    return create_loader(mix, "train", BATCH, distributed=True, seed=5, num_workers=1, drop_last=False,
                         decode=DecodeOptions(fields=["i"]))  # fmt: skip


def _play(loader, epochs: int, stop: tuple[int, int] | None = None) -> dict:
    seen: dict[int, list] = {}
    while loader.dataset_obj.epoch < epochs:
        epoch = loader.dataset_obj.epoch
        seen[epoch] = []
        for b in loader:
            seen[epoch].append([b["src"].tolist(), b["i"].tolist()])
            if stop == (epoch, len(seen[epoch])):
                return {"seen": seen, "state": loader.state_dict()}
    return {"seen": seen}


PHASES = ("first", "second")  # the second in a new process group: new processes, new workers


def prepare(folder: Path) -> None:
    import numpy as np

    from build_shards import SampleOptions, ShardOptions, build_shards

    for name, n in (("short", 300), ("long", 60)):
        docs = [{"__key__": f"{name}{i:04d}", "input_ids": np.zeros(_len(i, SCALE[name]), np.int32),
                 "i": i} for i in range(n)]  # fmt: skip
        build_shards(docs, folder / name, splits={"train": 1.0}, shards=ShardOptions(max_count=50),
                     samples=SampleOptions(lengths="input_ids"))  # fmt: skip


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


def test_both_ranks_yield_the_same_batches_and_each_source_its_tokens(runs):
    scale = (SCALE["short"], SCALE["long"])
    for epoch in ("0", "1"):
        assert len({len(r["full"]["seen"][epoch]) for r in runs}) == 1
        pairs = Counter(
            (s, i) for r in runs for srcs, ids in r["full"]["seen"][epoch]
            for s, i in zip(srcs, ids, strict=True)
        )  # fmt: skip
        assert sum(pairs.values()) - len(pairs) < 2  # each document once, but the padding
        tokens = Counter()
        for s, i in pairs:
            tokens[s] += _len(i, scale[s])
        assert abs(tokens[0] - 3000) < 13 * scale[0]  # 3/4 of 4000 tokens, within a document
        assert abs(tokens[1] - 1000) < 13 * scale[1]


def test_a_mid_epoch_state_resumes_exactly_in_a_new_process_group(runs):
    epoch, step = STOP
    for r in runs:
        head = r["first"]["seen"][str(epoch)]
        tail = r["second"]["seen"][str(epoch)]
        assert len(head) == step
        assert head + tail == r["full"]["seen"][str(epoch)]
        assert r["first"]["state"]["batches_done"] == step
