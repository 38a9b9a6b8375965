"""A token-weighted mix under real DDP: torchrun launches 2 CPU processes (gloo), each with a
DataLoader worker, over two sources of very different document lengths; both ranks yield the same
number of batches, each source's tokens per epoch are its share within one document, and a state
saved mid-epoch resumes exactly in a second torchrun.

This file is also the script torchrun runs (``python tests/test_mix_tokens_ddp.py --data ...
--out ... --phase first|second``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.torchrun_harness import run_torchrun

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


def main() -> None:
    import torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=["first", "second"], required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data, out = Path(args.data), Path(args.out)
    if args.phase == "first":
        report = {"full": _play(_loader(data), 2), "first": _play(_loader(data), 2, stop=STOP)}
    else:
        states = json.loads((out / "first.json").read_text())
        loader = _loader(data)
        loader.load_state_dict(states[rank]["first"]["state"])
        report = {"second": _play(loader, 2)}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if rank == 0:
        (out / f"{args.phase}.json").write_text(json.dumps(gathered))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import numpy as np

    from build_shards import SampleOptions, ShardOptions, build_shards

    tmp = tmp_path_factory.mktemp("tokmixddp")
    for name, n in (("short", 300), ("long", 60)):
        docs = [{"__key__": f"{name}{i:04d}", "input_ids": np.zeros(_len(i, SCALE[name]), np.int32),
                 "i": i} for i in range(n)]  # fmt: skip
        build_shards(docs, tmp / name, splits={"train": 1.0}, shards=ShardOptions(max_count=50),
                     samples=SampleOptions(lengths="input_ids"))  # fmt: skip
    for phase in ("first", "second"):
        run_torchrun(
            Path(__file__), "--data", str(tmp), "--out", str(tmp), "--phase", phase, cwd=tmp
        )
    first = json.loads((tmp / "first.json").read_text())
    second = json.loads((tmp / "second.json").read_text())
    return [{**a, **b} for a, b in zip(first, second, strict=True)]


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


if __name__ == "__main__":
    main()
