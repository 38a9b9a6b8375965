"""``wdsloader replay``: the samples of one training step, from the plan alone (no data read to
find them); their keys printed and, with ``--out``, their members written to a folder.

Over a mix (several DATASETs with ``--weights``/``--names``/..., or ``--mix mix.json``: see
:mod:`wdsloader.mix.mix_file`) each line also names the sample's source, and ``--out`` writes
each source's samples to a subfolder named after it."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from wdsloader.io.storage import parse_storage_options
from wdsloader.mix.options import Mix

SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``replay`` subcommand's arguments (the loader's, as the training run passed them)."""
    helptext = "print the samples of one training step (from the plan; --out: write them)"
    p = sub.add_parser("replay", help=helptext, description=helptext)
    p.add_argument("dataset", nargs="*", help="dataset folder or fsspec URL (several: a mix)")
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
    m = p.add_argument_group("a mix of sources (as the training run's Mix)")
    m.add_argument("--mix", default=None, metavar="MIX.JSON",
                   help="the mix as a JSON spec (wdsloader.mix.mix_file), instead of DATASETs")  # fmt: skip
    m.add_argument("--weights", default=None, metavar="W1,W2,...", help="one per DATASET")
    m.add_argument("--names", default=None, metavar="N1,N2,...", help="one per DATASET")
    m.add_argument("--unit", choices=("samples", "tokens"), default="samples")
    m.add_argument("--epoch-samples", type=int, default=None)
    m.add_argument("--epoch-tokens", type=int, default=None)
    m.add_argument("--batching", default="mixed", help="mixed (default) or stratified")


def mix_of(args: argparse.Namespace) -> Mix | None:
    """The mix the arguments describe (``--mix`` or several DATASETs), or None for one dataset.
    A ValueError for arguments that do not fit together."""
    from wdsloader.mix.mix_file import load_mix
    from wdsloader.mix.source import MixSource

    flags = {"--weights": args.weights, "--names": args.names,
             "--epoch-samples": args.epoch_samples, "--epoch-tokens": args.epoch_tokens,
             "--unit": None if args.unit == "samples" else args.unit,
             "--batching": None if args.batching == "mixed" else args.batching}  # fmt: skip
    given = [k for k, v in flags.items() if v is not None]
    if args.mix is not None:
        if args.dataset or given:
            raise ValueError(f"--mix holds the sources and the mix's options: not with "
                             f"{'DATASET arguments' if args.dataset else given}")  # fmt: skip
        return load_mix(args.mix)
    if not args.dataset:
        raise ValueError("give a DATASET (several for a mix) or --mix MIX.JSON")
    if len(args.dataset) == 1 and not given:
        return None
    n = len(args.dataset)
    weights = _listed(args.weights, "--weights", n, float)
    names = _listed(args.names, "--names", n, str)
    sources = [MixSource(url, weight=w, name=name)
               for url, w, name in zip(args.dataset, weights, names, strict=True)]  # fmt: skip
    return Mix(sources, epoch_samples=args.epoch_samples, epoch_tokens=args.epoch_tokens,
               unit=args.unit, batching=args.batching)  # fmt: skip


def _listed(raw: str | None, flag: str, n: int, kind: type) -> list[Any]:
    if raw is None:
        return [None] * n
    parts = raw.split(",")
    if len(parts) != n:
        raise ValueError(f"{flag} {raw!r}: {len(parts)} values for {n} DATASETs")
    try:
        return [kind(p.strip()) for p in parts]
    except ValueError:
        raise ValueError(f"{flag} {raw!r}: not {kind.__name__} values") from None


def run(args: argparse.Namespace) -> int:
    """Print ``index<TAB>key`` for each sample of the step (over a mix
    ``source<TAB>index<TAB>key``); write them with ``--out`` (over a mix: ``DIR/<source>/``)."""
    from wdsloader.access import MixedShardDataset, ShardDataset
    from wdsloader.stream import Topology, create_loader

    options = parse_storage_options(args.storage_option)
    mix = mix_of(args)
    if mix is not None:  # the sources' URLs, for error messages to mask their credentials
        args.dataset = [os.fspath(s.url) for s in mix.sources]
    loader = create_loader(
        mix if mix is not None else args.dataset[0], args.split, args.batch_size,
        args.num_workers, drop_last=args.drop_last, seed=args.seed, shuffle=args.shuffle,
        storage_options=options, topology=Topology(rank=args.rank, world_size=args.world_size),
    )  # fmt: skip
    step = loader.batch_indices(args.epoch, args.step)
    if mix is None:
        single = ShardDataset(args.dataset[0], args.split, storage_options=options)
        rows = [(None, single, i) for i in step.index.tolist()]
    else:
        ds = MixedShardDataset(mix, args.split, storage_options=options)
        assert step.source is not None
        rows = [(step.names[s], ds.source(s), i)
                for s, i in zip(step.source.tolist(), step.index.tolist(), strict=True)]  # fmt: skip
    folders = _folders(step.names)
    for name, source, i in rows:
        key, members = source.members(i)
        print(f"{i}\t{key}" if name is None else f"{name}\t{i}\t{key}")
        if args.out is not None:
            where = args.out if name is None else os.path.join(args.out, folders[name])
            os.makedirs(where, exist_ok=True)
            for ext, data in members.items():
                path = os.path.join(where, f"{i:09d}.{ext}")  # not the key: it may hold a path
                with open(path, "wb") as f:
                    f.write(data)
    return 0


def _folders(names: tuple[str, ...]) -> dict[str, str]:
    """Each source's subfolder of ``--out``: its name, or ``source<position>`` for a name
    that is not a plain file name."""
    return {n: n if SAFE_NAME.fullmatch(n) else f"source{p}" for p, n in enumerate(names)}
