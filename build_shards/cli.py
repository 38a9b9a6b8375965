"""The ``build-shards`` command line: ``build``, ``text`` and ``adopt``.

User errors (a missing input, a bad option value, an output that is already complete or being
written by another build, an unreadable input line, an empty source ...) print one line
``build-shards: error: ...`` to stderr and exit with status 2; the build removes what it wrote
(never another build's files, never the complete dataset an ``--overwrite`` would replace). An
I/O error while writing (a full disk ...) prints one line and exits with status 1: the finished
blocks are kept and a rerun resumes. Anything else is a bug and raises. Messages name the
command's flags (``--allow-nan``), not the library's arguments (``allow_nan=True``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from build_shards.lock import DEFAULT_LOCK_TIMEOUT
from wdsloader.errors import WdsLoaderError
from wdsloader.io.storage import parse_storage_options
from wdsloader.progress import progress_bar
from wdsloader.redact import redact

PROG = "build-shards"
USER_ERRORS: tuple[type[BaseException], ...] = (WdsLoaderError, OSError, ValueError)

BUILD_EXAMPLES = """\
  # JSONL files -> 80/10/10 split shards, 4 worker processes
  build-shards build data/*.jsonl -o ./ds --splits train=0.8,val=0.1,test=0.1 --workers 4

  # keep every question in one split; shards of at most 5000 samples or 128 MB
  build-shards build qa.jsonl -o ./qa --splits train=0.9,val=0.1 --group-by question_id \\
      --shard-max-count 5000 --shard-max-bytes 128MB

  # a dataset saved with datasets' save_to_disk, written to S3 (MinIO endpoint)
  build-shards build ./hf_saved -o s3://bucket/ds --format hf-disk \\
      --storage-option client_kwargs.endpoint_url=http://localhost:9000

  # on a running Ray cluster: one task per block, each reads its part of the input and writes
  # its shards to S3 (the same bytes as a local build)
  build-shards build 's3://raw/*.jsonl' -o s3://bucket/ds --engine ray --ray-address auto
"""
TEXT_EXAMPLES = """\
  # tokenize text for a language model: chunks of 1024 + 1 tokens, 10% held out
  build-shards text corpus/*.txt -o ./lm --tokenizer tokenizer.json --seq-length 1024 \\
      --splits train=0.9,val=0.1

  # JSONL with the text in "content", overlapping chunks, explicit end-of-document token
  build-shards text data.jsonl -o ./lm --tokenizer tok.json --seq-length 512 --stride 256 \\
      --text-field content --eos-id 0
"""
ADOPT_EXAMPLES = """\
  # index shards written by webdataset or GNU tar (writes .tar.idx files and manifest.json)
  build-shards adopt ./shards                  # splits from folders: ./shards/train, ./shards/val
  build-shards adopt ./flat --split-pattern '(?P<split>train|val|test)-\\d+\\.tar'
"""
STATUS = (
    "exit status: 0 on success, 2 on a user error (one line on stderr, nothing half-written), "
    "1 on an I/O error while writing such as a full disk (one line; finished blocks are kept "
    "and it says how to resume)"
)
# the library's keyword arguments that errors name (``name=value``), and this command's flags
# for them; a ``name=value`` entry maps that value alone
FLAGS = {
    "allow_nan": "--allow-nan",
    "overwrite": "--overwrite",
    "break_lock": "--force-unlock",
    "lock_timeout": "--lock-timeout",
    "bos_id": "--bos-id",
    "eos_id": "--eos-id",
    "add_special_tokens=False": "--no-separators",
}


def _epilog(*examples: str) -> str:
    return "examples:\n" + "\n".join(examples) + "\n" + STATUS + "\n"


class CliError(Exception):
    """A bad command-line value, reported as one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    one_line = " ".join(redact(message).split())
    sys.stderr.write(f"{PROG}: error: {one_line}\n")
    raise SystemExit(2)


# -- option values -------------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """Bytes from ``"256MB"``, ``"1.5GB"``, ``"64MiB"``, ``"4096"`` (KB/MB/GB are powers of
    1000, KiB/MiB/GiB of 1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 256MB, 1GiB, 4096)")
    number, unit = float(m.group(1)), m.group(2).lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    if prefix and "i" in unit:
        scale = 1024 ** ("kmgt".index(prefix) + 1)
    else:
        scale = _UNITS[prefix]
    value = int(number * scale)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be at least 1 byte")
    return value


def parse_splits(text: str) -> dict[str, float]:
    """``{"train": 0.8, "val": 0.2}`` from ``"train=0.8,val=0.2"``."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        name = name.strip()
        try:
            frac = float(value)
        except ValueError:
            frac = -1.0
        if not eq or not name or not 0 < frac <= 1 or name in out:
            raise argparse.ArgumentTypeError(
                f"invalid splits {text!r}: use NAME=FRACTION pairs such as train=0.9,val=0.1"
            )
        out[name] = frac
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


# -- parser --------------------------------------------------------------------------------------
def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="dataset folder or fsspec URL to write")
    p.add_argument("--splits", type=parse_splits, help="fractions, e.g. train=0.8,val=0.1,test=0.1")
    p.add_argument("--shard-max-count", type=_positive_int, default=10_000, metavar="N")
    p.add_argument(
        "--shard-max-bytes",
        type=parse_size,
        default=256 * 2**20,
        metavar="SIZE",
        help="e.g. 256MB, 1GiB (default 256MiB)",
    )
    p.add_argument("--workers", type=_positive_int, default=1, metavar="N")
    p.add_argument("--seed", type=_int, default=0, help="seed of the split assignment")
    p.add_argument("--overwrite", action="store_true", help="replace a complete dataset")
    p.add_argument(
        "--force-unlock",
        action="store_true",
        help="take the output's lock even if another build seems to hold it",
    )
    p.add_argument(
        "--lock-timeout",
        type=_positive_float,
        default=DEFAULT_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="another host's lock is stale after this long without a finished block "
        "(default: one day)",
    )
    _common_options(p)


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for the output (repeatable; dotted keys nest)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``build-shards``."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="Build WebDataset tar shards with a split manifest, or adopt existing ones.",
        epilog=_epilog(BUILD_EXAMPLES, TEXT_EXAMPLES, ADOPT_EXAMPLES),
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser(
        "build",
        help="JSONL/text files or a saved HF dataset -> shards",
        description="Write the samples of JSONL or text files (paths or globs), or of a folder "
        "saved with datasets' save_to_disk, as shards plus manifest.json.",
        epilog=_epilog(BUILD_EXAMPLES),
        formatter_class=fmt,
    )
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="files, globs or an hf-disk folder")
    b.add_argument("--format", choices=["auto", "jsonl", "text", "hf-disk"], default="auto")
    b.add_argument("--group-by", metavar="FIELD", help="keep samples sharing FIELD in one split")
    b.add_argument("--split-field", metavar="FIELD", help="the split is this field's value")
    b.add_argument("--key-field", default="__key__", metavar="FIELD", help="sample key field")
    b.add_argument("--allow-nan", action="store_true", help="count NaN/Inf instead of failing")
    b.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: this machine (--workers processes); ray: one Ray task per block, each "
        "reading its own part of the input (same shards, byte for byte)",
    )
    b.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster (--engine ray; default: RAY_ADDRESS, else a local Ray)",
    )
    _output_options(b)

    t = sub.add_parser(
        "text",
        help="tokenize text into packed LM chunks -> shards",
        description="Tokenize JSONL (a text field) or plain text (documents separated by blank "
        "lines), separate documents with the tokenizer's BOS/EOS, and pack the token stream "
        "into chunks of seq_length + 1 tokens stored as tokens.npy.",
        epilog=_epilog(TEXT_EXAMPLES),
        formatter_class=fmt,
    )
    t.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or text files, or globs")
    t.add_argument("--tokenizer", required=True, metavar="PATH", help="a tokenizer.json file")
    t.add_argument("--seq-length", type=_positive_int, required=True, metavar="L")
    t.add_argument("--stride", type=_positive_int, metavar="S", help="default: seq-length")
    t.add_argument("--text-field", default="text", metavar="FIELD", help="JSONL field (text)")
    t.add_argument("--bos-id", type=_int, metavar="ID", help="token put before each document")
    t.add_argument("--eos-id", type=_int, metavar="ID", help="token put after each document")
    t.add_argument(
        "--no-separators", action="store_true", help="concatenate documents without BOS/EOS"
    )
    _output_options(t)

    a = sub.add_parser(
        "adopt",
        help="index existing WebDataset shards (writes .tar.idx + manifest.json)",
        description="Scan the .tar files under a folder or URL (recursively), write X.tar.idx "
        "beside each and manifest.json at the root. The tars are not modified. Splits come "
        "from the first folder under the root, or from --split-pattern; else all is 'train'.",
        epilog=_epilog(ADOPT_EXAMPLES),
        formatter_class=fmt,
    )
    a.add_argument("root", metavar="DIR_OR_URL")
    a.add_argument("--split-pattern", metavar="REGEX", help="regex with a group (?P<split>...)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing manifest")
    a.add_argument("--workers", type=_positive_int, default=1, metavar="N")
    a.add_argument(
        "--non-strict", action="store_true", help="record samples with other fields, not fail"
    )
    _common_options(a)
    return parser


# -- progress and summary ------------------------------------------------------------------------
def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


class _Progress:
    """A tqdm bar fed by ``progress(done, total)`` callbacks; hidden when stderr is not a
    terminal (so errors stay one line in logs and tests)."""

    def __init__(self, unit: str, enabled: bool) -> None:
        self._bar = progress_bar(unit=unit, unit_scale=True, enabled=enabled)

    def __call__(self, done: int, total: int | None = None) -> None:
        bar = self._bar
        if total and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        self._bar.close()


def format_summary(manifest: Any, where: str, elapsed: float, verb: str = "built") -> str:
    """A table of shards, samples and bytes per split, a total, the time and the rates."""
    rows = [
        (name, len(s.shards), s.num_samples, s.num_bytes) for name, s in manifest.splits.items()
    ]
    total = (
        "total",
        sum(r[1] for r in rows),
        sum(r[2] for r in rows),
        sum(r[3] for r in rows),
    )
    width = max(5, *(len(r[0]) for r in rows))
    lines = [f"{'split':<{width}}  {'shards':>7}  {'samples':>12}  {'bytes':>10}"]
    for name, shards, samples, nbytes in [*rows, total]:
        lines.append(f"{name:<{width}}  {shards:>7,}  {samples:>12,}  {_human_bytes(nbytes):>10}")
    lines.insert(-1, "-" * len(lines[0]))
    rate = total[2] / elapsed if elapsed > 0 else float("inf")
    mbps = total[3] / elapsed / 1e6 if elapsed > 0 else float("inf")
    shown = redact(where)
    lines.append(f"{verb} {shown} in {elapsed:.2f} s ({rate:,.0f} samples/s, {mbps:.1f} MB/s)")
    return "\n".join(lines)


# -- after a user error ---------------------------------------------------------------------------
class _EmptyOutput:
    """Remembers whether a local output folder existed, to remove it when a failed run leaves it
    empty (the build itself removes what it wrote; this never removes a file)."""

    def __init__(self, output: str) -> None:
        self.path = output if "://" not in output else None
        self.existed = self.path is None or os.path.exists(self.path)

    def cleanup(self) -> None:
        if self.path is None or self.existed:
            return
        if os.path.isdir(self.path) and not os.listdir(self.path):
            os.rmdir(self.path)


# -- commands ------------------------------------------------------------------------------------
def _hf_disk_source(inputs: list[str]) -> Any:
    if len(inputs) != 1:
        raise CliError("--format hf-disk takes one folder (saved with datasets' save_to_disk)")
    if not os.path.isdir(inputs[0]):
        raise CliError(f"{inputs[0]}: not a folder saved with datasets' save_to_disk")
    try:
        import datasets
    except ImportError:
        raise CliError("--format hf-disk needs `datasets` (pip install wdsloader[hf])") from None
    return datasets.load_from_disk(inputs[0])


def _is_hf_disk(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, n)) for n in ("dataset_info.json", "dataset_dict.json")
    )


def _build_source(args: argparse.Namespace) -> Any:
    inputs = list(args.inputs)
    fmt = args.format
    if fmt == "auto" and len(inputs) == 1 and _is_hf_disk(inputs[0]):
        fmt = "hf-disk"
    if fmt == "hf-disk":
        return _hf_disk_source(inputs)
    from build_shards.sources import JsonlSource, TextSource, resolve_files

    files = resolve_files(inputs)  # a missing input fails here, before the output is touched
    if fmt == "auto":
        return files
    return JsonlSource(files) if fmt == "jsonl" else TextSource(files)


def _run_build(args: argparse.Namespace, options: dict[str, Any], progress: bool) -> Any:
    from build_shards.build import build_shards

    if args.engine != "ray" and args.ray_address is not None:
        _fail("--ray-address needs --engine ray")
    if args.engine == "ray" and args.workers != 1:
        _fail("--workers is for --engine local; --engine ray runs one task per block")
    source = _build_source(args)
    return build_shards(
        source,
        args.output,
        splits=args.splits,
        split_field=args.split_field,
        group_by=args.group_by,
        key_field=args.key_field,
        allow_nan=args.allow_nan,
        progress=progress,
        engine=args.engine,
        ray_address=args.ray_address,
        **options,
    )


def _run_text(args: argparse.Namespace, options: dict[str, Any], progress: bool) -> Any:
    from build_shards.text import build_text_shards, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    return build_text_shards(
        args.inputs,
        args.output,
        tokenizer,
        seq_length=args.seq_length,
        stride=args.stride,
        text_field=args.text_field,
        add_special_tokens=not args.no_separators,
        bos_id=args.bos_id,
        eos_id=args.eos_id,
        splits=args.splits,
        progress=progress,
        **options,
    )


def _write_command(
    args: argparse.Namespace, run: Callable[[argparse.Namespace, dict[str, Any], bool], Any]
) -> int:
    storage_options = parse_storage_options(args.storage_option)
    options = {
        "shard_max_count": args.shard_max_count,
        "shard_max_bytes": args.shard_max_bytes,
        "workers": args.workers,
        "seed": args.seed,
        "overwrite": args.overwrite,
        "storage_options": storage_options or None,
        "lock_timeout": args.lock_timeout,
        "break_lock": args.force_unlock,
    }
    created = _EmptyOutput(args.output)
    # build_shards' own bar shows samples/s and MB/s; only on a terminal, so that an error
    # stays one line on a redirected stderr
    progress = not args.no_progress and sys.stderr.isatty()
    start = time.perf_counter()
    try:
        manifest = run(args, options, progress)
    except USER_ERRORS:
        created.cleanup()
        raise
    print(format_summary(manifest, args.output, time.perf_counter() - start))
    return 0


def _adopt_command(args: argparse.Namespace) -> int:
    from build_shards.adopt import adopt

    storage_options = parse_storage_options(args.storage_option)
    bar = _Progress("shards", enabled=not args.no_progress)
    start = time.perf_counter()
    try:
        manifest = adopt(
            args.root,
            splits=args.split_pattern,
            storage_options=storage_options or None,
            overwrite=args.overwrite,
            strict=not args.non_strict,
            workers=args.workers,
            progress=bar,
        )
    finally:
        bar.close()
    print(format_summary(manifest, args.root, time.perf_counter() - start, verb="adopted"))
    het = manifest.build.get("heterogeneous")
    if het:
        print(f"note: {het['num_samples']} samples carry other fields than the first one")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``build-shards`` with ``argv`` (default: the process arguments); returns the exit
    status. User errors print one line to stderr and exit 2 (``SystemExit``)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "adopt":
            return _adopt_command(args)
        run = _run_build if args.command == "build" else _run_text
        return _write_command(args, run)
    except CliError as exc:
        _fail(str(exc))
    except USER_ERRORS as exc:
        message = _describe_error(exc)
        if isinstance(exc, OSError) and getattr(exc, "resumable", False):
            sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
            raise SystemExit(1) from None
        _fail(message)


def _describe_error(exc: BaseException) -> str:
    """One line: the error (an OSError's file and reason), its notes, in the command's flags."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    text = "; ".join([text, *getattr(exc, "__notes__", ())])
    return _as_flags(text, getattr(exc, "options", ()))


def _as_flags(text: str, options: tuple[str, ...]) -> str:
    """``text`` with each ``name=value`` of the keyword arguments ``options`` in flag form:
    ``--flag`` for True (or a bare ``name=``), ``--flag VALUE`` for other values."""
    for name in options:
        text = re.sub(rf"\b{re.escape(name)}=([^\s,;)]*)", _as_flag, text)
    return text


def _as_flag(m: re.Match[str]) -> str:
    name, value = m.group(0).split("=", 1)
    if m.group(0) in FLAGS:
        return FLAGS[m.group(0)]
    flag = FLAGS.get(name)
    if flag is None:
        return m.group(0)
    return flag if value in ("", "True") else f"{flag} {value}"


if __name__ == "__main__":
    raise SystemExit(main())
