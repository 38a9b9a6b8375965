"""Running a build's blocks: which blocks are left, run by the build's engine, with progress."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from build_shards.engines.base import BlockTask, Engine, Output
from build_shards.sources import Source
from build_shards.write.blocks import BlockJob
from build_shards.write.records import BlockRecord

Progress = bool | Callable[[int, int], None]


def blocks_left(
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, BlockRecord],
    block_size: int,
    bar: ProgressBar,
) -> Iterator[BlockTask]:
    """The blocks to build; a task's ``items`` is None when its runner reads the range itself.
    Finished blocks are skipped (a stream is still read past)."""
    if stream is None:
        assert src.length is not None
        for b in range(math.ceil(src.length / block_size)):
            if b in completed:
                bar.update(completed[b].num_items, 0)
                continue
            start, stop = b * block_size, min(src.length, (b + 1) * block_size)
            yield BlockTask(b, start, stop, src.iter_range(start, stop) if src.in_memory else None)
        return
    for b in itertools.count():
        head = next(stream, None)
        if head is None:
            return
        items = itertools.chain([head], itertools.islice(stream, block_size - 1))
        if b in completed:
            deque(items, maxlen=0)
            bar.update(completed[b].num_items, 0)
            continue
        yield BlockTask(b, b * block_size, None, items)


def run_blocks(
    job: BlockJob,
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, BlockRecord],
    block_size: int,
    engine: Engine,
    out: Output,
    bar: ProgressBar,
) -> dict[int, BlockRecord]:
    """Build every unfinished block with ``engine``; all records by block (compacted: key
    hashes instead of keys)."""
    records = {b: rec.compact() for b, rec in completed.items()}
    tasks = blocks_left(src, stream, completed, block_size, bar)
    report = bar.update if bar.active else None
    for b, rec in engine.run(job, tasks, out, report):
        records[b] = rec.compact()
    return records


class ProgressBar:
    """tqdm bar (items/s and MB), a callable ``(done, total)``, or nothing."""

    def __init__(self, progress: Progress, total: int | None) -> None:
        self.active = bool(progress)
        self.total = total or 0
        self.done = 0
        self.nbytes = 0
        self._callback = progress if callable(progress) else None
        self._bar = None
        self._t0 = time.monotonic()
        if progress is True:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total or None, unit="sample", unit_scale=True, desc="build-shards"
            )

    def update(self, n: int, nbytes: int) -> None:
        self.done += n
        self.nbytes += nbytes
        if self._callback is not None:
            self._callback(self.done, self.total)
        if self._bar is not None:
            mb = self.nbytes / 1e6
            rate = mb / max(time.monotonic() - self._t0, 1e-9)
            self._bar.set_postfix_str(f"{mb:,.1f} MB, {rate:,.1f} MB/s", refresh=False)
            self._bar.update(n)

    def complete(self) -> None:
        """The build finished: a total that was a hint (JSONL lines, blank ones too) becomes
        the items done."""
        if self._bar is not None and self.done != self.total:
            self._bar.total = self.done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
