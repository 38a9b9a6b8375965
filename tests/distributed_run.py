"""Run under torchrun by tests/test_multinode.py: one rank reads an epoch (or part of it) and
writes what it saw as JSON (``--out DIR``: ``rank{global rank}.json``).

``--mesh`` builds a 2 x 2 DeviceMesh ("dp", "tp") and passes it to create_loader; otherwise the
loader takes rank and world size from torch.distributed. ``--stop-after K`` stops after K
batches and rank 0 also writes the loader state to ``state.json``; ``--resume FILE`` loads one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import torch.distributed as dist

from wdsloader import create_loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--storage-options", default=None, help="JSON")
    p.add_argument("--mesh", action="store_true")
    p.add_argument("--state-after", type=int, default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    kw: dict = {"batch_size": args.batch_size, "num_workers": args.num_workers, "seed": 5}
    if args.storage_options:
        kw["storage_options"] = json.loads(args.storage_options)
    if args.mesh:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        loader = create_loader(args.data, "train", device_mesh=mesh, dp_dim="dp", **kw)
    else:
        loader = create_loader(args.data, "train", distributed=True, **kw)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    rank = dist.get_rank()
    out = Path(args.out)
    keys: list[list[str]] = []
    for batch in loader:
        keys.append(list(batch["__key__"]))
        if len(keys) == args.state_after and rank == 0:
            (out / "state.json").write_text(json.dumps(loader.state_dict()))
    config = dataclasses.asdict(loader.dataset_obj.config)
    report = {"rank": rank, "plan_rank": loader.dataset_obj.rank, "len": len(loader)}
    report.update(keys=keys, config=config, node=os.environ.get("GROUP_RANK"))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
