"""The documents of JSONL or plain text files, for the text builder (:mod:`build_shards.text`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

from build_shards.errors import BuildError

PathArg = str | os.PathLike[str]
Paths = PathArg | Iterable[PathArg]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _format_of(path: str) -> str:
    from fsspec.utils import infer_compression

    name = path.lower()
    compression = infer_compression(name)
    if compression:
        name = name.rsplit(".", 1)[0]
    return "jsonl" if name.endswith(JSONL_SUFFIXES) else "text"


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a file read as UTF-8 (a bad byte names file:line)."""
    import fsspec

    with fsspec.open(path, "rb", compression="infer") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BuildError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from None


def _jsonl_documents(path: str, text_field: str) -> Iterator[str]:
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BuildError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise BuildError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
            )
        if text_field not in record:
            raise BuildError(
                f"{path}:{lineno}: no field {text_field!r} (fields: {sorted(record)[:10]})"
            )
        value = record[text_field]
        if not isinstance(value, str):
            raise BuildError(
                f"{path}:{lineno}: field {text_field!r} is {type(value).__name__}, not a string"
            )
        yield value


def _text_documents(path: str) -> Iterator[str]:
    lines: list[str] = []
    for _, line in _lines(path):
        if line.strip():
            lines.append(line)
            continue
        doc = "".join(lines).strip()
        lines = []
        if doc:
            yield doc
    doc = "".join(lines).strip()
    if doc:
        yield doc


def iter_documents(paths: Paths, *, text_field: str = "text") -> Iterator[str]:
    """The documents of JSONL or plain text files, in order.

    ``paths``: a path, glob or fsspec URL, or a list of them (globs expand sorted). Files ending
    in ``.jsonl``/``.json``/``.ndjson`` (optionally compressed, e.g. ``.jsonl.gz``) are JSONL: one
    object per line, the document is its ``text_field`` (blank lines are skipped; a bad line or
    a missing field raises :class:`BuildError` naming ``file:line``). Other files are plain
    text: documents are separated by blank (or whitespace-only) lines, stripped, empty ones
    dropped. Missing inputs raise :class:`BuildError` before anything is read.
    """
    from build_shards.sources.files import resolve_files

    for path in resolve_files(paths):
        if _format_of(path) == "jsonl":
            yield from _jsonl_documents(path, text_field)
        else:
            yield from _text_documents(path)
