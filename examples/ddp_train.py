"""Train a tiny model with DDP on a wdsloader dataset, checkpoint mid-epoch and resume exactly.

Run on CPU with two processes (gloo):

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --data /tmp/ddp_ds --make-data

Every rank gets the same number of batches (no hangs at the end of an epoch), each sample is seen
once per epoch across ranks, and a checkpoint taken mid-epoch (``--stop-after``) resumes with
exactly the batches that were still to come (``--resume``). ``--report`` writes what every rank
saw as JSON (used by the tests).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from wdsloader import WorkerOptions, create_loader, set_epoch


def make_data(path: str) -> None:
    """1001 samples of a 4-d vector in 7 shards of unequal size (an awkward case on purpose)."""
    import numpy as np

    from build_shards import ShardOptions, build_shards

    rng = np.random.default_rng(0)
    samples = [{"vec": rng.normal(size=4).astype(np.float32)} for _ in range(1001)]
    build_shards(samples, path, shards=ShardOptions(max_count=150), overwrite=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--make-data", action="store_true", help="build the demo dataset first")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--checkpoint", default=None, help="where --stop-after saves, --resume reads")
    p.add_argument("--stop-after", type=str, default=None, help="EPOCH:BATCH, save and exit")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--report", default=None, help="write the keys every rank saw (JSON)")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.make_data and rank == 0:
        make_data(args.data)
    dist.barrier()

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = create_loader(
        args.data,
        "train",
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        distributed=True,
        drop_last=args.drop_last,
        workers=WorkerOptions(persistent_workers=args.num_workers > 0),
    )
    start_epoch = 0
    if args.resume:
        ckpt = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"][rank])
        start_epoch = ckpt["loader"][rank]["epoch"]
    stop = tuple(map(int, args.stop_after.split(":"))) if args.stop_after else None

    seen: dict[int, list[str]] = {}
    steps: dict[int, int] = {}
    for epoch in range(start_epoch, args.epochs):
        set_epoch(loader, epoch)
        seen[epoch], steps[epoch] = [], 0
        for batch in loader:
            x = batch["vec"]
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()  # all-reduce: a rank with fewer batches would hang here
            opt.step()
            seen[epoch].extend(batch["__key__"])
            steps[epoch] += 1
            if stop == (epoch, steps[epoch]):
                states = [None] * world
                dist.all_gather_object(states, loader.state_dict())
                if rank == 0:
                    torch.save(
                        {"model": model.state_dict(), "opt": opt.state_dict(), "loader": states},
                        args.checkpoint,
                    )
                break
        if rank == 0 and steps[epoch]:
            print(f"epoch {epoch}: {steps[epoch]} steps/rank, loss {loss.item():.4f}")
        if stop and stop[0] == epoch:
            break

    gathered = [None] * world
    dist.all_gather_object(gathered, {"seen": seen, "steps": steps, "len": len(loader)})
    if rank == 0 and args.report:
        with open(args.report, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
