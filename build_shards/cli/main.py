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
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from build_shards.cli.parser import PROG, CliError, build_parser, fail
from build_shards.cli.report import Progress, describe_error, format_summary, small_records_hint
from build_shards.options import LockOptions, RayEngine, SampleOptions, ShardOptions
from wdsloader.errors import WdsLoaderError
from wdsloader.io.setup_errors import setup_error
from wdsloader.io.storage import parse_storage_options

USER_ERRORS: tuple[type[BaseException], ...] = (WdsLoaderError, OSError, ValueError)


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
        fail("--ray-address needs --engine ray")
    if args.engine == "ray" and args.workers != 1:
        fail("--workers is for --engine local; --engine ray runs one task per block")
    if args.split_field is not None and args.group_by is not None:
        fail("--group-by groups the samples that --splits assigns; --split-field names each "
             "sample's split: pass one of them")  # fmt: skip
    schema = None if args.schema is None else read_schema(args.schema)
    source = _build_source(args)
    return build_shards(
        source,
        args.output,
        splits=args.splits,
        samples=SampleOptions(
            split_field=args.split_field,
            group_by=args.group_by,
            key_field=args.key_field,
            allow_nan=args.allow_nan,
            lengths=args.lengths,
        ),
        progress=progress,
        engine=RayEngine(address=args.ray_address) if args.engine == "ray" else args.engine,
        schema=schema,
        **options,
    )


def read_schema(path: str) -> dict[str, Any]:
    """The field declarations of ``--schema FILE``: a JSON object (YAML for ``.yaml``/``.yml``
    files, with PyYAML) of field name -> spec object."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CliError(f"--schema {path}: {exc.strerror or exc}") from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise CliError(f"--schema {path}: YAML needs PyYAML (pip install pyyaml)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CliError(f"--schema {path}: not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CliError(f"--schema {path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CliError(
            f"--schema {path}: expected an object of field -> spec, e.g. "
            '{"score": {"encoding": "json", "optional": true}}'
        )
    return data


def _run_text(args: argparse.Namespace, options: dict[str, Any], progress: bool) -> Any:
    from build_shards.text import build_text_shards, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    return build_text_shards(
        args.inputs,
        args.output,
        tokenizer,
        seq_length=args.seq_length,
        stride=args.stride,
        pack=args.pack,
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
        "shards": ShardOptions(
            max_count=args.shard_max_count,
            max_bytes=args.shard_max_bytes,
            compression=getattr(args, "compression", None),  # build only
            group_small_fields=getattr(args, "group_small_fields", False),
        ),
        "workers": args.workers,
        "seed": args.seed,
        "overwrite": args.overwrite,
        "storage_options": storage_options or None,
        "lock": LockOptions(timeout=args.lock_timeout, break_lock=args.force_unlock),
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
    if args.command == "build":
        hint = small_records_hint(
            manifest, _input_bytes(args), args.group_small_fields, args.compression is not None
        )
        if hint is not None:
            print(hint)
    return 0


def _input_bytes(args: argparse.Namespace) -> int | None:
    """The bytes of ``build``'s input files (of a saved HF dataset's folder); None if unknown
    (compressed files: their bytes are not the data's)."""
    from build_shards.sources import resolve_files
    from build_shards.sources.files import COMPRESSION_SUFFIXES
    from wdsloader.io.storage import url_to_fs

    try:
        if len(args.inputs) == 1 and os.path.isdir(args.inputs[0]):
            return sum(
                os.path.getsize(os.path.join(d, f))
                for d, _, files in os.walk(args.inputs[0])
                for f in files
            )
        total = 0
        for path in resolve_files(args.inputs):
            if path.lower().endswith(COMPRESSION_SUFFIXES):
                return None
            fs, p = url_to_fs(path)
            total += int(fs.size(p) or 0)
        return total
    except (OSError, WdsLoaderError):  # the input changed since the build: no hint
        return None


def _adopt_command(args: argparse.Namespace) -> int:
    from build_shards.adopt import adopt

    storage_options = parse_storage_options(args.storage_option)
    bar = Progress("shards", enabled=not args.no_progress)
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
            lengths=args.lengths,
        )
    finally:
        bar.close()
    print(format_summary(manifest, args.root, time.perf_counter() - start, verb="adopted"))
    het = manifest.build.get("heterogeneous")
    if het:
        print(f"note: {het['num_samples']} samples carry other fields than the first one")
    skipped = manifest.build.get("skipped_members")
    if skipped:
        print(f"note: {skipped['num_members']} tar members are no sample member, skipped:")
        for item in skipped["examples"]:
            print(f"  {item['shard']}: {item['member']!r}: {item['why']}")
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
        fail(str(exc))
    except Exception as exc:  # user errors and storage set-up mistakes: one line
        setup = setup_error(exc, _target(args), _options(args))
        if setup is not None:
            fail(str(setup))
        if not isinstance(exc, USER_ERRORS):
            raise  # a bug: its traceback
        message = describe_error(exc)
        if isinstance(exc, OSError) and getattr(exc, "resumable", False):
            sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
            raise SystemExit(1) from None
        fail(message)


def _target(args: argparse.Namespace) -> str:
    """The dataset URL the command writes (named in storage set-up errors)."""
    return str(args.root if args.command == "adopt" else args.output)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return parse_storage_options(args.storage_option)
    except ValueError:
        return {}
