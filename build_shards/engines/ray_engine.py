"""The Ray engine: one Ray task per block of the plan, each reading its own range of the source
and writing its shards straight to the output; the driver only gathers the records.

Ray tasks, not Ray Data: a block of our plan is already the unit Ray should schedule (a fixed
range of source items that becomes fixed shard names), so a task per block maps onto it one to
one. Ray Data would cut the rows into its own blocks (sizes it chooses at run time), carry
every row through its object store, and write files with its own names and no atomic publish.

Failures: a task whose worker dies, or that raises an ``OSError`` (a flaky read or upload), is
retried by Ray (:data:`MAX_RETRIES`); a retried block rewrites the same names with the same bytes
and its record is written last, so nothing is duplicated or lost. Any other error (bad data, a
schema error) is raised at once and the tasks still running are cancelled. Stopping the driver
cancels its tasks; the finished blocks' records stay, and a rerun resumes like a local build.

``ray`` is imported when a Ray build starts, never by ``import build_shards``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from build_shards.engines.base import BlockTask, Output, Report, record_bytes, write_block
from build_shards.errors import BuildError, BuildWorkerError
from build_shards.sources import JsonlSource, Source, TextSource
from build_shards.write.blocks import BlockJob
from build_shards.write.records import BlockRecord

log = logging.getLogger("build_shards")

MAX_RETRIES = 3  # attempts after the first, per block (a dead worker or an OSError)
RETRY_EXCEPTIONS: list[type[BaseException]] = [OSError]  # transient; other errors are the data's
INFLIGHT_PER_CPU = 2  # tasks submitted ahead per CPU of the cluster
CANCEL_WAIT_S = 30.0  # seconds to wait for cancelled tasks to stop before returning
DISTRIBUTABLE = (
    "a datasets Dataset or DatasetDict, a torch map-style Dataset (with __len__), or JSONL or "
    "text files"
)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "engine='ray' needs Ray: pip install 'wdsloader[ray]' (or pip install ray)"
        ) from None
    return ray


def ray_write_block(job: BlockJob, url: str, storage_options: Any, task: BlockTask) -> BlockRecord:
    """The body of a block's Ray task: open the output and write the block."""
    from wdsloader.io.storage import url_to_fs

    fs, root = url_to_fs(url, storage_options)
    return write_block(job, fs, root, task)


class RayClusterEngine:
    """Runs each block as a Ray task on the cluster at ``address`` (see the module's text)."""

    name = "ray"
    single_process = False

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._started = False  # this engine called ray.init (and shuts it down at close)

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False)
            self._started = True
            log.info("connected to Ray: %s", ray.cluster_resources())
        return ray

    def expect(self, seconds: float | None) -> None:
        """Ray runs a task per block whatever the size (the cluster is already running)."""

    def close(self) -> None:
        if self._started:
            self._started = False
            _ray().shutdown()

    def prepare(self, src: Source) -> Source:
        """The source with its files scanned (JSONL, text: one task per file); a source that
        lives in this process (a list, an iterator, an iterable dataset) is refused."""
        if isinstance(src, (JsonlSource, TextSource)):
            return self._scan_files(src)
        if src.indexable and not src.in_memory:
            return src
        raise BuildError(
            f"engine='ray' reads the source in its tasks, and a {src.kind} source lives in this "
            f"process: it cannot be distributed. Ray reads {DISTRIBUTABLE}; write the items to "
            "JSONL files or a datasets Dataset (Dataset.from_generator), or use the local engine"
        )

    def _scan_files(self, src: JsonlSource | TextSource) -> Source:
        from build_shards.sources.ranged import RangedFileSource, scan_file

        ray = self._connect()
        scan = ray.remote(scan_file).options(
            max_retries=MAX_RETRIES, retry_exceptions=RETRY_EXCEPTIONS
        )
        refs = [scan.remote(src.kind, path) for path in src.files]
        # a failed scan leaves the others running, never cancelled: they only read, and Ray
        # 2.60 aborts the driver process when a task it cancelled completes at that moment
        # ("Tried to complete task that was not pending"; seen with these short scans)
        scans = [
            _get(ray, ref, f"the scan of {path}") for ref, path in zip(refs, src.files, strict=True)
        ]
        return RangedFileSource(src, scans)

    def run(
        self, job: BlockJob, tasks: Iterator[BlockTask], out: Output, report: Report | None
    ) -> Iterator[tuple[int, BlockRecord]]:
        ray = self._connect()
        remote = ray.remote(ray_write_block).options(
            num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=RETRY_EXCEPTIONS
        )
        limit = max(2, INFLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
        job_ref = ray.put(job)  # sent to the object store once, not with every task
        inflight: dict[Any, int] = {}
        try:
            for task in tasks:
                if task.items is not None:
                    raise AssertionError("a Ray task reads its own range: no items from here")
                ref = remote.remote(job_ref, out.url, out.storage_options, task)
                inflight[ref] = task.block
                while len(inflight) >= limit:
                    yield from self._finished(ray, inflight, report)
            while inflight:
                yield from self._finished(ray, inflight, report)
        except BaseException:
            _cancel(ray, list(inflight))
            raise

    @staticmethod
    def _finished(
        ray: Any, inflight: dict[Any, int], report: Report | None
    ) -> Iterator[tuple[int, BlockRecord]]:
        """Wait for at least one task; ``(block, record)`` of each finished one."""
        done, _ = ray.wait(list(inflight), num_returns=1)
        for ref in done:
            block = inflight.pop(ref)
            record = _get(ray, ref, f"block {block}")
            if report is not None:
                report(record.num_items, record_bytes(record))
            yield block, record


def _get(ray: Any, ref: Any, what: str) -> Any:
    """``ray.get(ref)``, with the task's own exception raised as itself (a BuildError stays a
    BuildError) and a worker that died past its retries as BuildWorkerError."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        log.debug("Ray task for %s failed: %s", what, exc)
        if isinstance(cause, BaseException):
            raise cause from None
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
        raise BuildWorkerError(
            f"a Ray worker died running {what} ({type(exc).__name__}), after "
            f"{MAX_RETRIES} retries. Blocks finished before are kept: a rerun with the same "
            "options resumes"
        ) from None


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel those of ``refs`` still running and wait (a while) until they stopped, so that no
    task of this build still writes once the driver returned. Finished tasks are not cancelled:
    Ray 2.60 aborts the driver when a task completes just as it is cancelled."""
    if not refs:
        return
    _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
    for ref in running:
        ray.cancel(ref)
    ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
