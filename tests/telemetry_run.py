"""Run under torchrun by tests/test_telemetry.py: each rank reads an epoch, rank 1's collate
sleeping ``--sleep`` seconds a batch (so rank 1 waits longest), and writes its own metrics and
``loader.metrics(all_ranks=True)`` as JSON (``--out DIR``: ``rank{rank}.json``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from wdsloader import create_loader


class Collate:
    """Stacks ``emb``; sleeps ``sleep`` seconds first."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def __call__(self, samples: list[dict]) -> dict:
        time.sleep(self.sleep)
        return {"emb": torch.stack([torch.as_tensor(s["emb"]) for s in samples])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sleep", type=float, required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    collate = Collate(args.sleep if rank == 1 else 0.0)
    loader = create_loader(args.data, "train", 10, 0, distributed=True, collate_fn=collate)
    batches = sum(1 for _ in loader)
    mine, group = loader.metrics(), loader.metrics(all_ranks=True)
    report = {"rank": rank, "batches": batches, "mine": mine, "group": group}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
