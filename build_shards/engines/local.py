"""The local engine: blocks in this process (``workers=1``) or in local worker processes."""

from __future__ import annotations

from collections.abc import Iterator

from build_shards.blocks import BlockJob
from build_shards.engines.base import BlockTask, Output, Report, write_block
from build_shards.records import BlockRecord
from build_shards.sources import Source


class LocalEngine:
    """Runs :func:`~build_shards.engines.base.write_block` inline or in ``workers`` spawned
    processes (:func:`build_shards.pool.run_pool`). Reads every source ``build_shards`` takes:
    indexable ones in the workers, sequential ones in this process."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.single_process = workers == 1

    def prepare(self, src: Source) -> Source:
        return src

    def run(
        self, job: BlockJob, tasks: Iterator[BlockTask], out: Output, report: Report | None
    ) -> Iterator[tuple[int, BlockRecord]]:
        if self.workers == 1:
            for task in tasks:
                yield task.block, write_block(job, out.fs, out.root, task, report=report)
            return
        from build_shards.pool import run_pool

        yield from run_pool(
            job, tasks, self.workers, out.fs, out.root, out.url, out.storage_options, report
        )

    def close(self) -> None:
        pass
