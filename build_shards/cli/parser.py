"""The ``build-shards`` argument parser and its option values (sizes, split ratios); a usage
error is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

from build_shards.commit.lock import DEFAULT_LOCK_TIMEOUT
from wdsloader.redact import redact

PROG = "build-shards"

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
  # index shards written by webdataset or GNU tar (writes hidden indexes and manifest.json)
  build-shards adopt ./shards                  # splits from folders: ./shards/train, ./shards/val
  build-shards adopt ./flat --split-pattern '(?P<split>train|val|test)-\\d+\\.tar'
  build-shards adopt ./built --lengths input_ids # add lengths (packing, token mixing) to a dataset
"""
STATUS = (
    "exit status: 0 on success, 2 on a user error (one line on stderr, nothing half-written), "
    "1 on an I/O error while writing such as a full disk (one line; finished blocks are kept "
    "and it says how to resume)"
)


def _epilog(*examples: str) -> str:
    return "examples:\n" + "\n".join(examples) + "\n" + STATUS + "\n"


class CliError(Exception):
    """A bad command-line value, reported as one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
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
    parser = _Parser(
        prog=PROG,
        description="Build WebDataset tar shards with a split manifest, or adopt existing ones.",
        epilog=_epilog(BUILD_EXAMPLES, TEXT_EXAMPLES, ADOPT_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _build_command(sub)
    _text_command(sub)
    _adopt_command(sub)
    return parser


def _build_command(sub: argparse._SubParsersAction[Any]) -> None:
    """The ``build`` command: JSONL/text files or a saved HF dataset -> shards."""
    b = sub.add_parser(
        "build",
        help="JSONL/text files or a saved HF dataset -> shards",
        description="Write the samples of JSONL or text files (paths or globs), or of a folder "
        "saved with datasets' save_to_disk, as shards plus manifest.json.",
        epilog=_epilog(BUILD_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="files, globs or an hf-disk folder")
    b.add_argument("--format", choices=["auto", "jsonl", "text", "hf-disk"], default="auto")
    b.add_argument("--group-by", metavar="FIELD", help="keep samples sharing FIELD in one split")
    b.add_argument("--split-field", metavar="FIELD", help="the split is this field's value")
    b.add_argument("--key-field", default="__key__", metavar="FIELD", help="sample key field")
    b.add_argument("--allow-nan", action="store_true", help="count NaN/Inf instead of failing")
    b.add_argument(
        "--lengths",
        metavar="FIELD",
        help="record each sample's length of FIELD (e.g. input_ids) beside its shard, for "
        "sequence packing planned without reading samples",
    )
    b.add_argument(
        "--schema",
        metavar="FILE",
        help="declare fields: a JSON (or YAML, with PyYAML) object of field -> spec, e.g. "
        '{"score": {"encoding": "json", "optional": true}}; fields not declared are inferred '
        "from the first 1,000 samples",
    )
    b.add_argument(
        "--group-small-fields",
        action="store_true",
        help="write a sample's small fields (ints, JSON scalars, short strings) as one member "
        "KEY.fields.json; the loader still yields each field",
    )
    b.add_argument(
        "--compression",
        choices=["gzip"],
        help="write .tar.gz shards (every tar and WebDataset reader reads them; the loader "
        "still reads samples one by one)",
    )
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


def _text_command(sub: argparse._SubParsersAction[Any]) -> None:
    """The ``text`` command: tokenize text into packed LM chunks -> shards."""
    t = sub.add_parser(
        "text",
        help="tokenize text into packed LM chunks -> shards",
        description="Tokenize JSONL (a text field) or plain text (documents separated by blank "
        "lines), separate documents with the tokenizer's BOS/EOS, and pack the token stream "
        "into chunks of seq_length + 1 tokens stored as tokens.npy.",
        epilog=_epilog(TEXT_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL or text files, or globs")
    t.add_argument("--tokenizer", required=True, metavar="PATH", help="a tokenizer.json file")
    t.add_argument("--seq-length", type=_positive_int, required=True, metavar="L")
    t.add_argument("--stride", type=_positive_int, metavar="S", help="default: seq-length")
    t.add_argument(
        "--pack",
        choices=("windows", "documents"),
        default="windows",
        help="windows: fixed chunks of seq-length + 1 tokens (default); documents: one sample "
        "per document with its length recorded, for create_loader(packing=Packing(...))",
    )
    t.add_argument("--text-field", default="text", metavar="FIELD", help="JSONL field (text)")
    t.add_argument("--bos-id", type=_int, metavar="ID", help="token put before each document")
    t.add_argument("--eos-id", type=_int, metavar="ID", help="token put after each document")
    t.add_argument(
        "--no-separators", action="store_true", help="concatenate documents without BOS/EOS"
    )
    _output_options(t)


def _adopt_command(sub: argparse._SubParsersAction[Any]) -> None:
    """The ``adopt`` command: index existing WebDataset shards."""
    a = sub.add_parser(
        "adopt",
        help="index existing WebDataset shards (writes hidden indexes, key indexes + "
        "manifest.json)",
        description="Scan the .tar files under a folder or URL (recursively), write the hidden "
        "index .X.tar.wdsidx and key index .X.tar.wdskeys (for ShardDataset.get(key)) beside "
        "each, manifest.json and a dataset card README.md (unless "
        "one of yours is there) at the root. The tars and other tools' files (X.tar.idx) are "
        "not modified. Splits come "
        "from the first folder under the root, or from --split-pattern; else all is 'train'.",
        epilog=_epilog(ADOPT_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("root", metavar="DIR_OR_URL")
    a.add_argument("--split-pattern", metavar="REGEX", help="regex with a group (?P<split>...)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing manifest")
    a.add_argument("--workers", type=_positive_int, default=1, metavar="N")
    a.add_argument(
        "--non-strict", action="store_true", help="record samples with other fields, not fail"
    )
    a.add_argument(
        "--lengths",
        metavar="FIELD",
        help="record each sample's length of FIELD (first dimension / len) in .X.tar.wdslen "
        "beside its shard, for packing and token-weighted mixing; on a dataset that already has "
        "a manifest, adds only the lengths",
    )
    _common_options(a)
