"""The engine-agnostic unit of a build: one block of the plan in, its records out.

A build's plan is a list of :class:`BlockTask` (block ``b`` holds source items
``[b * block_size, (b + 1) * block_size)``). :func:`write_block` turns one task into its shards
(deterministic names ``{split}/{prefix}-BBBBB-PPP.tar``, each written under a temporary name and
published complete) and its :class:`~build_shards.write.records.BlockRecord` (per shard: count, bytes,
sha256; the block's first and last key). It depends only on its arguments: running it twice
writes the same bytes, so an engine may retry a block, or run it anywhere, without changing the
output.

An :class:`Engine` decides where :func:`write_block` runs: this process or local worker
processes (:mod:`build_shards.engines.local`), Ray tasks (:mod:`build_shards.engines.ray_engine`).
A third engine (Spark, Dask) implements the same three methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from build_shards.sources import Source
from build_shards.write.blocks import BlockJob, run_block
from build_shards.write.records import BlockRecord

Report = Callable[[int, int], None]  # (items, bytes) just written


@dataclass(frozen=True, slots=True)
class Output:
    """Where a build writes: the filesystem, the root path on it, and its URL + options (for
    worker processes and remote tasks, which open the filesystem again)."""

    fs: Any
    root: str
    url: str
    storage_options: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class BlockTask:
    """One item of a build's plan: block ``block`` holds source items ``[start, stop)``.

    ``stop`` is None for a block of a sequential source, whose items this process reads and
    hands over in ``items``; ``items`` is None when the block's runner reads the range itself.
    """

    block: int
    start: int
    stop: int | None
    items: Iterable[tuple[int, Any]] | None = None


def write_block(
    job: BlockJob,
    fs: Any,
    root: str,
    task: BlockTask,
    *,
    abort: Any = None,
    report: Report | None = None,
) -> BlockRecord:
    """Write the shards of one block and its record ``_build/block-BBBBB.json``; the record.

    The items are ``task.items``, or else the task's range read from ``job.source``. On any
    error the block's temporary files and its published shards are removed.
    """
    items = task.items
    if items is None:
        if job.source is None or task.stop is None:
            raise ValueError(f"block {task.block}: no items and no source range to read")
        items = job.source.iter_range(task.start, task.stop)
    return run_block(job, fs, root, task.block, task.start, items, abort=abort, report=report)


def record_bytes(record: BlockRecord) -> int:
    """The bytes of the shards a block wrote."""
    return sum(s.num_bytes for s in record.all_shards())


class Engine(Protocol):
    """Runs the blocks of a build: where :func:`write_block` runs, and how its source is read."""

    name: str
    single_process: bool  # every block is written by this process (memory:// outputs work)

    def prepare(self, src: Source) -> Source:
        """The source as this engine's runners read it (the same items in the same order), or a
        :class:`~build_shards.errors.BuildError` when this engine cannot read it."""
        ...

    def expect(self, seconds: float | None) -> None:
        """The estimated seconds of work of the blocks left (None: unknown), before :meth:`run`:
        an engine may run a small build with fewer processes."""
        ...

    def run(
        self, job: BlockJob, tasks: Iterator[BlockTask], out: Output, report: Report | None
    ) -> Iterator[tuple[int, BlockRecord]]:
        """Run ``tasks``; yields ``(block, record)`` as blocks finish (in any order)."""
        ...

    def close(self) -> None:
        """Release what :meth:`prepare` or :meth:`run` started (idempotent)."""
        ...
