"""``wdsloader replay``: the samples of one training step, from the plan alone (no data read to
find them); their keys printed and, with ``--out``, their members written to a folder."""

from __future__ import annotations

import argparse
import os

from wdsloader.io.storage import parse_storage_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``replay`` subcommand's arguments (the loader's, as the training run passed them)."""
    helptext = "print the samples of one training step (from the plan; --out: write them)"
    p = sub.add_parser("replay", help=helptext, description=helptext)
    p.add_argument("dataset", help="dataset folder or fsspec URL")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--split", default="train")
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--step", type=int, required=True, help="the batch's number in the epoch")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--drop-last", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--out", default=None, help="write each sample's members into this folder")


def run(args: argparse.Namespace) -> int:
    """Print ``index<TAB>key`` for each sample of the step; write them with ``--out``."""
    from wdsloader.access import ShardDataset
    from wdsloader.stream import Topology, create_loader

    options = parse_storage_options(args.storage_option)
    loader = create_loader(
        args.dataset, args.split, args.batch_size, args.num_workers,
        drop_last=args.drop_last, seed=args.seed, shuffle=args.shuffle, storage_options=options,
        topology=Topology(rank=args.rank, world_size=args.world_size),
    )  # fmt: skip
    indices = loader.batch_indices(args.epoch, args.step).index.tolist()
    ds = ShardDataset(args.dataset, args.split, storage_options=options)
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
    for i in indices:
        key, members = ds.members(i)
        print(f"{i}\t{key}")
        if args.out is not None:
            for ext, data in members.items():
                name = f"{i:09d}.{ext}"  # not the key: a key may hold a path
                with open(os.path.join(args.out, name), "wb") as f:
                    f.write(data)
    return 0
