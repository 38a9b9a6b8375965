"""``wdsloader report DATASET [DATASET ...] -o report.html``: the dataset's report page (see
:mod:`wdsloader.report`); several datasets (e.g. the sources of a mix) share one page, a section
each."""

from __future__ import annotations

import argparse

from wdsloader.io.storage import parse_storage_options
from wdsloader.redact import redact

DEFAULT_OUTPUT = "report.html"


def samples_arg(text: str) -> int | None:
    """``--samples``: a positive count, or ``all`` (None)."""
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'all', got {text!r}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``wdsloader report``."""
    from wdsloader.report import DEFAULT_SAMPLES

    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help="the HTML file to write")
    p.add_argument(
        "--split", action="append", default=None, help="only this split (repeatable; default: all)"
    )
    p.add_argument(
        "--samples",
        type=samples_arg,
        default=DEFAULT_SAMPLES,
        help=f"rows read per split for the statistics (default {DEFAULT_SAMPLES}; 'all': every "
        "row)",
    )
    p.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    p.add_argument("--previews", type=int, default=8, help="rows previewed per split")
    p.add_argument("--validate", action="store_true", help="also run `wdsloader validate`")
    p.add_argument("--deep", action="store_true", help="with --validate: decode every sample")
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="decode pickle members (.pyd, .pkl): they can run arbitrary code: trusted data only",
    )


def run(args: argparse.Namespace) -> tuple[int, list[str]]:
    """Write the page. Returns the exit status (1: ``--validate`` found problems) and the lines
    to print."""
    from wdsloader.report import write_reports

    datas = write_reports(
        args.dataset,
        args.output,
        splits=args.split,
        samples=args.samples,
        seed=args.seed,
        previews=args.previews,
        storage_options=parse_storage_options(args.storage_option) or None,
        validate=args.validate,
        deep=args.deep,
        allow_pickle=args.allow_pickle,
    )
    lines, status = [], 0
    for dataset, data in zip(args.dataset, datas, strict=True):
        read = sum(len(s.indices) - len(s.errors) for s in data.splits)
        lines.append(
            f"{redact(dataset, data.secrets)}: {read:,} rows read; report in {args.output}"
        )
        if data.validation is not None and not data.validation.ok:
            problems = len(data.validation.problems)
            lines.append(f"validate: {problems:,} problems (listed in the report)")
            status = 1
    return status, lines
