"""Resume: the blocks an unfinished build kept must come from the same data as the source now.

Each kept block's first and last items are compared with the source (their key, split and
encoded bytes): an indexable source at once, before anything is written; a stream as it passes.
A mismatch raises :class:`SourceChangedError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from build_shards.errors import SourceChangedError, naming_options
from build_shards.sources import Source
from build_shards.write.blocks import BlockJob, item_digest
from build_shards.write.records import BlockEnd, BlockRecord

ENDS = ("first", "last")


def check_kept(
    job: BlockJob,
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, BlockRecord],
    url: str,
) -> Iterator[tuple[int, Any]] | None:
    """Compare each kept block's first and last items with the source (their key, split and
    encoded bytes): an indexable source now, before anything is written; a stream as it passes
    (the returned stream raises). A mismatch raises SourceChangedError."""
    if not completed or stream is not None:
        return _checked_stream(job, stream, completed, url) if completed else stream
    for block, rec in sorted(completed.items()):
        for end in ENDS:
            i = _end(rec, end).index
            for index, raw in src.iter_range(i, i + 1):
                _compare(job, block, rec, end, index, raw, url)
    return None


def _checked_stream(
    job: BlockJob,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, BlockRecord],
    url: str,
) -> Iterator[tuple[int, Any]]:
    assert stream is not None
    checks: dict[int, list[tuple[int, str]]] = {}
    for block, rec in completed.items():
        for end in ENDS:
            checks.setdefault(_end(rec, end).index, []).append((block, end))
    for index, raw in stream:
        for block, end in checks.pop(index, ()):
            _compare(job, block, completed[block], end, index, raw, url)
        yield index, raw
    if checks:
        index = min(checks)
        block, end = checks[index][0]
        raise naming_options(
            SourceChangedError(
                f"{url}: the source ended before item {index}, the {end} item of the unfinished "
                f"build's finished block {block}: it is not the data that block was written "
                "from. Resuming would mix old and new samples: pass overwrite=True to start over"
            ),
            "overwrite",
        )


def _compare(
    job: BlockJob, block: int, rec: BlockRecord, end: str, index: int, raw: Any, url: str
) -> None:
    key, digest = item_digest(job, index, raw)
    want = _end(rec, end)
    if digest == want.digest:
        return
    if key != want.key:
        what = f"its key is {key!r}, the block holds {want.key!r}"
    else:
        what = f"sample {key!r} has other content or split than the block holds"
    raise naming_options(
        SourceChangedError(
            f"{url}: finished block {block} of the unfinished build (source items "
            f"{rec.start}-{rec.stop - 1}) was written from other data: source item {index}, "
            f"the block's {end} item, differs ({what}). Resuming would mix old and new samples: "
            "pass overwrite=True to start over"
        ),
        "overwrite",
    )


def _end(rec: BlockRecord, end: str) -> BlockEnd:
    return rec.first if end == "first" else rec.last
