"""The ``wdsloader`` command line: look at a dataset and read samples from it."""

from __future__ import annotations

import argparse
import json
import sys

from wdsloader.storage import parse_storage_options

EPILOG = """examples:
  wdsloader info ./my_dataset
  wdsloader info s3://bucket/prefix --storage-option anon=true
  wdsloader head ./my_dataset --split val -n 3
"""


def _info(args: argparse.Namespace) -> int:
    from wdsloader.format import Manifest

    m = Manifest.load(args.dataset, parse_storage_options(args.storage_option))
    print(
        f"{args.dataset}: format {m.format} {m.version}, {m.num_samples} samples, "
        f"{m.num_bytes / 1e6:.1f} MB"
    )
    print(f"{'split':10s} {'shards':>7s} {'samples':>10s} {'MB':>10s}")
    for name, split in m.splits.items():
        print(
            f"{name:10s} {len(split.shards):7d} {split.num_samples:10d} "
            f"{split.num_bytes / 1e6:10.1f}"
        )
    print("schema:")
    for field, spec in m.schema.items():
        extra = f" {spec.dtype}" if spec.dtype else ""
        extra += f" {spec.shape}" if spec.shape is not None else ""
        extra += f" range={spec.range}" if spec.range else ""
        print(f"  {field:20s} .{spec.ext}{extra}")
    if m.dims:
        print("dims: " + ", ".join(f"{k}={v}" for k, v in m.dims.items()))
    return 0


def _head(args: argparse.Namespace) -> int:
    from wdsloader import create_loader

    loader = create_loader(
        args.dataset,
        args.split,
        batch_size=1,
        shuffle=False,
        storage_options=parse_storage_options(args.storage_option),
    )
    for i, batch in enumerate(loader):
        if i == args.n:
            break
        shown = {}
        for k, v in batch.items():
            shown[k] = f"tensor{list(v.shape[1:])} {v.dtype}" if hasattr(v, "shape") else v[0]
        print(json.dumps(shown, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="wdsloader",
        description="Inspect and read wdsloader datasets.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("info", "print the manifest summary"),
        ("head", "print the first samples of a split"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("dataset", help="dataset folder or fsspec URL")
        p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
        if name == "head":
            p.add_argument("--split", default="train")
            p.add_argument("-n", type=int, default=5)
    args = parser.parse_args(argv)
    from wdsloader.errors import WdsLoaderError

    try:
        return {"info": _info, "head": _head}[args.command](args)
    except (WdsLoaderError, ValueError, FileNotFoundError) as exc:
        print(f"wdsloader: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
