"""JSONL and text files read by item range: what lets a distributed engine's tasks each read their
own block of a file source.

The local engine reads file sources once, in order (items are numbered in that stream). To read
items ``[start, stop)`` without the items before them, each file is scanned once
(:func:`scan_file`, one task per file): its item count, and every ``CHECKPOINT_EVERY``-th item's
byte offset and line number. A range read seeks to the last checkpoint at or before its first
item and skips the few items in between (a compressed file has no seekable offsets: its reads
start at the file's beginning). The items, their numbering and their raw values are exactly the
sequential source's, so the shards are the same bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from build_shards.errors import BuildError
from build_shards.sources.base import Source
from build_shards.sources.files import COMPRESSION_SUFFIXES, JsonlSource, TextSource

CHECKPOINT_EVERY = 4096  # items between two recorded offsets of a file


@dataclass(frozen=True, slots=True)
class FileScan:
    """One file's item count and checkpoints ``(item, byte offset, line number)``, item 0 first."""

    path: str
    count: int
    checkpoints: tuple[tuple[int, int, int], ...]


def _seekable(path: str) -> bool:
    return not path.lower().endswith(COMPRESSION_SUFFIXES)


def _open(path: str) -> BinaryIO:
    import fsspec

    f: BinaryIO = fsspec.open(path, "rb", compression="infer").open()
    return f


def _text_line(path: str, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{path}:{lineno}: not UTF-8 text: {exc}") from None


def _lines(kind: str, path: str, f: BinaryIO, pos: int, lineno: int) -> Iterator[Any]:
    """``(byte offset, line number, line, starts an item)`` of each non-blank line read from
    ``f`` (at byte ``pos``, line ``lineno``): every one starts an item in JSONL, the first line
    of each document (after a blank line or at the file's start) in text."""
    after_blank = True
    for raw in f:
        if kind == "jsonl":
            if raw.strip():
                yield pos, lineno, raw, True
        elif _text_line(path, lineno, raw).strip():
            yield pos, lineno, raw, after_blank
            after_blank = False
        else:
            after_blank = True
        pos += len(raw)
        lineno += 1


def scan_file(kind: str, path: str, every: int = CHECKPOINT_EVERY) -> FileScan:
    """Count the items of one ``kind`` (``"jsonl"`` or ``"text"``) file and record a checkpoint
    every ``every`` items (only item 0 for a compressed file)."""
    count = 0
    checkpoints = [(0, 0, 1)]
    seekable = _seekable(path)
    with _open(path) as f:
        for pos, lineno, _, starts in _lines(kind, path, f, 0, 1):
            if not starts:
                continue
            if count % every == 0 and count and seekable:
                checkpoints.append((count, pos, lineno))
            count += 1
    return FileScan(path, count, tuple(checkpoints))


class RangedFileSource(Source):
    """A :class:`JsonlSource` or :class:`TextSource` with its files scanned: indexable, the same
    items and raw values, read by range."""

    indexable = True

    def __init__(self, src: JsonlSource | TextSource, scans: list[FileScan]) -> None:
        if [s.path for s in scans] != list(src.files):
            raise ValueError("one scan per file of the source, in order")
        self._src = src
        self.kind = src.kind
        self.decoder = src.decoder
        self.scans = scans
        self.starts: list[int] = []
        total = 0
        for scan in scans:
            self.starts.append(total)
            total += scan.count
        self.length = total

    def describe(self) -> dict[str, Any]:
        return self._src.describe()

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        assert self.length is not None
        stop = self.length if stop is None else min(stop, self.length)
        first = max(0, bisect.bisect_right(self.starts, start) - 1)
        for i in range(first, len(self.scans)):
            offset, scan = self.starts[i], self.scans[i]
            lo, hi = max(start, offset), min(stop, offset + scan.count)
            if lo >= stop:
                return
            if lo < hi:
                for j, raw in self._read(scan, lo - offset, hi - offset):
                    yield offset + j, raw

    def _read(self, scan: FileScan, lo: int, hi: int) -> Iterator[tuple[int, Any]]:
        """Items ``[lo, hi)`` of one file, as the sequential source gives them."""
        k = bisect.bisect_right([c[0] for c in scan.checkpoints], lo) - 1
        item, pos, lineno = scan.checkpoints[k]
        item -= 1  # the index of the item being read
        with _open(scan.path) as f:
            if pos:
                f.seek(pos)
            if self.kind == "jsonl":
                for _, n, raw, _ in _lines("jsonl", scan.path, f, pos, lineno):
                    item += 1
                    if item >= hi:
                        return
                    if item >= lo:
                        yield item, (scan.path, n, raw)
                return
            yield from self._read_text(scan.path, f, pos, lineno, item, lo, hi)

    @staticmethod
    def _read_text(
        path: str, f: BinaryIO, pos: int, lineno: int, item: int, lo: int, hi: int
    ) -> Iterator[tuple[int, str]]:
        lines: list[str] = []
        for _, n, raw, starts in _lines("text", path, f, pos, lineno):
            if starts:  # the document collected so far is complete
                if lines:
                    yield item, "\n".join(lines)
                    lines = []
                item += 1
                if item >= hi:
                    return
            if item >= lo:
                lines.append(_text_line(path, n, raw))
        if lines:
            yield item, "\n".join(lines)
