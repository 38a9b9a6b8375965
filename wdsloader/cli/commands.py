"""The ``wdsloader`` command line: look at a dataset and read samples from it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from wdsloader.cli import replay
from wdsloader.io.setup_errors import setup_error
from wdsloader.io.storage import parse_storage_options
from wdsloader.redact import redact, secrets_of

EPILOG = """examples:
  wdsloader info ./my_dataset
  wdsloader info s3://bucket/prefix --storage-option anon=true
  wdsloader head ./my_dataset --split val -n 3
  wdsloader validate ./my_dataset                 # files, sizes, indexes, sha256
  wdsloader validate ./my_dataset --split val --deep   # also decode and check every sample
  wdsloader bench ./my_dataset --num-workers 8 --batch-size 256 --max-batches 200
  wdsloader replay ./my_dataset --epoch 3 --step 812 --rank 17 --world-size 64 \\
      --batch-size 256 --num-workers 8 --seed 0 --out ./step812   # the samples of that step
  wdsloader replay --mix mix.json --epoch 3 --step 812 --batch-size 256   # a mix's step
  wdsloader report ./my_dataset -o report.html --validate   # one HTML page: stats, previews
"""


def _info(args: argparse.Namespace) -> int:
    from wdsloader.curriculum.curriculum import stored_curriculum
    from wdsloader.io.manifest_io import load_manifest, manifest_where

    options = parse_storage_options(args.storage_option)
    m = load_manifest(args.dataset, options)
    stored_curriculum(m.loader_defaults, manifest_where(args.dataset, options))
    print(
        f"{redact(args.dataset)}: format {m.format} {m.version}, {m.num_samples} samples, "
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
        extra += " optional" if spec.optional else ""
        print(f"  {field:20s} .{spec.ext}{extra}")
    if m.dims:
        print("dims: " + ", ".join(f"{k}={v}" for k, v in m.dims.items()))
    return 0


def _head(args: argparse.Namespace) -> int:
    from wdsloader.stream import create_loader

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
        shown = {k: show_value(v[0]) for k, v in batch.items()}
        print(json.dumps(shown, default=str, ensure_ascii=False))
    return 0


SHOWN_ITEMS = 4  # leading values of an array that `head` prints
SHOWN_CHARS = 200  # characters of a string that `head` prints


def show_value(value: Any) -> Any:
    """A sample's value as ``wdsloader head`` prints it: scalars as numbers, short strings as is,
    arrays and tensors abbreviated (``tensor(shape=[64], dtype=float32, [0.12, -0.5, ...])``),
    bytes by their length; JSON values (dicts, lists) as they are."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a torch tensor or numpy array
        kind = "array" if type(value).__module__ == "numpy" else "tensor"
        dtype = str(value.dtype).removeprefix("torch.")
        if len(value.shape) == 0:
            return value.item()
        flat = value.reshape(-1)[: SHOWN_ITEMS + 1].tolist()
        items = [_number(x) for x in flat[:SHOWN_ITEMS]]
        more = ", ..." if len(flat) > SHOWN_ITEMS else ""
        return f"{kind}(shape={list(value.shape)}, dtype={dtype}, [{', '.join(items)}{more}])"
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]}... ({len(value)} characters)"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"bytes(len={len(value)})"
    return value


def _number(x: Any) -> str:
    """An array item: floats in 4 significant digits that still read as floats (``1.0``)."""
    if not isinstance(x, float):
        return str(x)
    text = f"{x:.4g}"
    return text if any(c in text for c in ".en") else f"{text}.0"  # 'n': nan, inf


def _validate(args: argparse.Namespace) -> int:
    from wdsloader.validate.dataset_check import validate_dataset

    report = validate_dataset(
        args.dataset,
        args.split,
        deep=args.deep,
        storage_options=parse_storage_options(args.storage_option),
        progress=True,
        allow_pickle=args.allow_pickle,
    )
    for line in report.problems:
        print(line)
    shards, samples = report.shards_checked, report.samples_checked
    checked = f"{_count(shards, 'shard')}, {_count(samples, 'sample')} checked"
    mode = " (deep)" if args.deep else ""
    if report.ok:
        print(f"OK: {checked}{mode}")
        return 0
    print(f"{_count(len(report.problems), 'problem')} in {redact(args.dataset)}: {checked}{mode}")
    return 1


def _count(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _bench(args: argparse.Namespace) -> int:
    """``wdsloader bench DATASET [--split S] [--num-workers N] [--batch-size B]
    [--max-batches K] [--storage-option KEY=VALUE ...]``: read with a progress bar, print
    samples/s, MB/s and time to first batch. Returns the exit status."""
    from wdsloader.cli import benchmark

    options = parse_storage_options(args.storage_option or [])
    result = benchmark.measure_loader(
        args.dataset,
        args.split,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        max_batches=args.max_batches,
        storage_options=options or None,
        progress=True,
    )
    ttfb = result.time_to_first_batch_s
    lines = [
        f"{redact(args.dataset)} [{args.split}], batch {args.batch_size}, "
        f"num_workers {args.num_workers}: {result.samples:,} samples in {result.batches:,} "
        f"batches, {result.seconds:.2f} s",
        f"samples/s:           {result.samples_per_s:,.0f}",
        f"MB/s:                {result.mb_per_s:,.1f}  (manifest's average sample size)",
        f"time to first batch: {'-' if ttfb is None else f'{ttfb:.3f} s'}",
    ]
    if result.peak_rss_mb is not None:
        lines.append(f"peak RSS:            {result.peak_rss_mb:,.0f} MB (main process)")
    lines += _tuning_lines(result)
    print("\n".join(lines))
    return 0


def _tuning_lines(result: Any) -> list[str]:
    """What a remote read chose and the share of the path's ceiling it reached."""
    t = result.tuning
    if t is None:
        return []
    rtt = "-" if t["rtt_s"] is None else f"{t['rtt_s'] * 1e3:.1f} ms"
    rate = "-" if t["bytes_per_s"] is None else f"{t['bytes_per_s'] / 1e6:,.0f} MB/s"
    lines = [
        f"measured path:       round trip {rtt}, {rate} a connection (main process)",
        f"chosen:              requests of {t['request_bytes'] / 2**20:g} MiB, "
        f"{t['concurrency']} in flight, {t['readahead_bytes'] / 2**20:g} MiB read ahead",
    ]
    if result.ceiling_mb_per_s:
        lines.append(
            f"ceiling:             {result.ceiling_mb_per_s:,.1f} MB/s (parallel 16 MiB ranged "
            f"GETs of the same shards): {result.ceiling_share:.0%} reached"
        )
    return lines


def _report(args: argparse.Namespace) -> int:
    """``wdsloader report DATASET [DATASET ...] -o report.html``: see
    :mod:`wdsloader.cli.report_cmd`."""
    from wdsloader.cli import report_cmd

    status, lines = report_cmd.run(args)
    print("\n".join(lines))
    return status


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
        ("validate", "check shards, indexes and checksums (--deep: every sample too)"),
        ("bench", "measure the loader's throughput on a split"),
        ("report", "write a self-contained HTML page: splits, schema, statistics, previews"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext)
        if name == "report":  # several: one page, a section each (e.g. the sources of a mix)
            p.add_argument("dataset", nargs="+", help="dataset folders or fsspec URLs")
        else:
            p.add_argument("dataset", help="dataset folder or fsspec URL")
        p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
        if name == "head":
            p.add_argument("--split", default="train")
            p.add_argument("-n", type=int, default=5)
        elif name == "validate":
            p.add_argument("--split", default=None, help="only this split (default: all)")
            p.add_argument(
                "--deep",
                action="store_true",
                help="also read, decode and check every sample (dtypes, shapes, NaN/Inf, ranges)",
            )
            p.add_argument(
                "--allow-pickle",
                action="store_true",
                help="with --deep: decode pickle members (.pyd, .pkl) and object arrays; they "
                "can run arbitrary code: trusted data only",
            )
        elif name == "bench":
            p.add_argument("--split", default="train")
            p.add_argument("--num-workers", type=int, default=4)
            p.add_argument("--batch-size", type=int, default=256)
            p.add_argument(
                "--max-batches", type=int, default=None, help="stop after K batches (default: all)"
            )
        elif name == "report":
            from wdsloader.cli import report_cmd

            report_cmd.add_arguments(p)
    replay.add_parser(sub)
    args = parser.parse_args(argv)
    from wdsloader.errors import WdsLoaderError

    commands = {
        "info": _info,
        "head": _head,
        "validate": _validate,
        "bench": _bench,
        "report": _report,
        "replay": replay.run,
    }
    try:
        return commands[args.command](args)
    except Exception as exc:  # user errors and storage set-up mistakes: one line, exit 2
        shown = setup_error(exc, (_datasets(args) or [""])[0], _options(args)) or exc
        if not isinstance(shown, (WdsLoaderError, ValueError, OSError)):
            raise  # a bug: its traceback
        print(f"wdsloader: error: {redact(shown, _secrets(args))}", file=sys.stderr)
        return 2


def _options(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return parse_storage_options(args.storage_option)
    except ValueError:
        return {}


def _secrets(args: argparse.Namespace) -> tuple[str, ...]:
    """The credentials given on the command line, masked in error messages."""
    return secrets_of(_options(args), *_datasets(args))


def _datasets(args: argparse.Namespace) -> list[str]:
    """The command's dataset arguments (``report`` takes several)."""
    return list(args.dataset) if isinstance(args.dataset, list) else [args.dataset]


if __name__ == "__main__":
    raise SystemExit(main())
