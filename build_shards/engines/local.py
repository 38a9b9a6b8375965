"""The local engine: blocks in this process (``workers=1``) or in local worker processes."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from build_shards.engines.base import BlockTask, Output, Report, write_block
from build_shards.errors import BuildError
from build_shards.sources import Source
from build_shards.write.blocks import BlockJob
from build_shards.write.records import BlockRecord

log = logging.getLogger("build_shards")

SMALL_BUILD_S = 2.0
"""Estimated seconds of work under which a build runs in this process whatever ``workers``
asks for. Starting workers costs about 0.5 s of wall time before the first block (a fork
server, then each worker loads the job; measured on 2 cores: 3,000 small items took 0.3 s in
one process and 2.2 s with 2 workers), more when the main script imports torch."""


class LocalEngine:
    """Runs :func:`~build_shards.engines.base.write_block` inline or in ``workers`` worker
    processes (:func:`build_shards.engines.pool.run_pool`). Reads every source ``build_shards`` takes:
    indexable ones in the workers, sequential ones in this process. A build of known length
    starts no more processes than it has blocks, and none for a single block or for a build
    estimated under :data:`SMALL_BUILD_S` seconds (see :meth:`expect`): starting them costs
    more than they save. ``processes``: how many worker processes the last run started."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.single_process = workers == 1
        self.expected_s: float | None = None
        self.processes = 0

    def prepare(self, src: Source) -> Source:
        """``src``; a BuildError for a ``ray.data`` Dataset with ``workers > 1`` (its blocks
        live on Ray, which worker processes are not part of)."""
        if self.workers > 1 and src.kind == "ray-data":
            raise BuildError(
                f"a ray.data Dataset is read from Ray's object store: build it with engine='ray' "
                f"(or workers=1), not workers={self.workers}"
            )
        return src

    def expect(self, seconds: float | None) -> None:
        """The estimated seconds of work of the blocks left (None: unknown)."""
        self.expected_s = seconds

    def run(
        self, job: BlockJob, tasks: Iterator[BlockTask], out: Output, report: Report | None
    ) -> Iterator[tuple[int, BlockRecord]]:
        workers = self.workers
        if workers > 1:
            from build_shards.engines.pool import check_picklable

            check_picklable(job, workers)
            if self.expected_s is not None and self.expected_s < SMALL_BUILD_S:
                log.info(
                    "a small build (about %.1f s of work): one process, not %d workers",
                    self.expected_s, workers,
                )  # fmt: skip
                workers = 1
        tasks, workers = fit_workers(tasks, workers)
        self.processes = 0 if workers == 1 else workers
        if workers == 1:
            for task in tasks:
                yield task.block, write_block(job, out.fs, out.root, task, report=report)
            return
        from build_shards.engines.pool import run_pool

        yield from run_pool(
            job, tasks, workers, out.fs, out.root, out.url, out.storage_options, report
        )

    def close(self) -> None:
        pass


def fit_workers(tasks: Iterator[BlockTask], workers: int) -> tuple[Iterator[BlockTask], int]:
    """``(tasks, processes)``: the same tasks, and ``workers`` capped at the number of blocks
    when the first ``workers`` tasks show it is smaller. Only ranges of a source of known length
    are looked ahead at (a sequential source's blocks share one stream: taking the next one
    would read the items of the one before)."""
    if workers == 1:
        return tasks, 1
    ahead: list[BlockTask] = []
    for task in tasks:
        ahead.append(task)
        if task.stop is None or len(ahead) == workers:
            return itertools.chain(ahead, tasks), workers
    return iter(ahead), max(1, len(ahead))
