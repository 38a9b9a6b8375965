"""File inputs: JSONL (one sample per line) and plain text (documents between blank lines),
local or remote, optionally compressed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from build_shards.errors import BuildError
from build_shards.sources.base import SequentialSource
from wdsloader.io.setup_errors import setup_errors_in_one_line
from wdsloader.io.storage import url_to_fs

COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
COUNT_MAX_BYTES = 2**30  # local uncompressed JSONL up to this size gets its lines counted


def decode_jsonl_line(raw: tuple[str, int, bytes]) -> dict[str, Any]:
    """A JSONL line ``(file, line number, bytes)`` as a dict, or a BuildError naming file:line."""
    name, lineno, line = raw
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{name}:{lineno}: not a valid JSON line: {exc}") from None
    if not isinstance(obj, dict):
        raise BuildError(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def decode_text_document(raw: str) -> dict[str, Any]:
    """A plain-text document as the sample ``{"text": doc}``."""
    return {"text": raw}


def base_suffix(path: str) -> str:
    low = path.lower()
    for comp in COMPRESSION_SUFFIXES:
        if low.endswith(comp):
            low = low[: -len(comp)]
            break
    return os.path.splitext(low)[1]


def resolve_files(spec: str | os.PathLike[str] | Iterable[Any]) -> list[str]:
    """Paths or URLs of the files named by a path, a glob or a list of them (globs sorted)."""
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[str] = []
    for item in specs:
        text = os.fspath(item)
        fs, path = url_to_fs(text)
        with setup_errors_in_one_line(text, fs=fs):  # a dead endpoint: one line naming text
            if any(c in text for c in "*?["):
                matches = sorted(fs.glob(path))
                if not matches:
                    raise BuildError(f"no input file matches {text!r}")
                files.extend(
                    fs.unstrip_protocol(m) if "://" in text else m
                    for m in matches
                    if not fs.isdir(m)
                )
            elif not fs.exists(path):
                raise BuildError(f"input not found: {text}")
            elif fs.isdir(path):
                raise BuildError(
                    f"input {text} is a folder: name the files (a glob such as dir/*.jsonl)"
                )
            else:
                files.append(text)
    return files


def _file_stamp(path: str) -> dict[str, Any]:
    fs, p = url_to_fs(path)
    info = fs.info(p)
    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag")
    return {"path": path, "size": info.get("size"), "stamp": str(stamp)}


class _FileSource(SequentialSource):
    def __init__(self, files: list[str]) -> None:
        super().__init__()
        self.files = files

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": [_file_stamp(f) for f in self.files]}


class JsonlSource(_FileSource):
    """JSONL files, one sample per non-blank line; a bad line is a BuildError naming file:line."""

    kind = "jsonl"
    decoder = staticmethod(decode_jsonl_line)

    def count_hint(self) -> int | None:
        """The number of lines of local uncompressed files of up to :data:`COUNT_MAX_BYTES` in
        all (blank lines counted too: a close upper bound), else None."""
        if any(base_suffix(p) != os.path.splitext(p.lower())[1] or "://" in p for p in self.files):
            return None
        try:
            if sum(os.path.getsize(p) for p in self.files) > COUNT_MAX_BYTES:
                return None
            return sum(_count_lines(p) for p in self.files)
        except OSError:
            return None

    def _iterate(self) -> Iterator[Any]:
        import fsspec

        for path in self.files:
            with fsspec.open(path, "rb", compression="infer") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        yield (path, lineno, line)


class TextSource(_FileSource):
    """Plain text files; documents are separated by blank lines, each becomes ``{"text": doc}``."""

    kind = "text"
    decoder = staticmethod(decode_text_document)

    def _iterate(self) -> Iterator[Any]:
        import fsspec

        for path in self.files:
            lines: list[str] = []
            with fsspec.open(path, "rb", compression="infer") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8").rstrip("\r\n")
                    except UnicodeDecodeError as exc:
                        raise BuildError(f"{path}:{lineno}: not UTF-8 text: {exc}") from None
                    if line.strip():
                        lines.append(line)
                    elif lines:
                        yield "\n".join(lines)
                        lines = []
            if lines:
                yield "\n".join(lines)


def _count_lines(path: str) -> int:
    """Lines of a local file (a last line without a newline counts)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")
