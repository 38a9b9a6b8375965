"""The Ray engine: one Ray task per block of the plan, each writing its block's shards straight to
the output; the driver only gathers the records.

Every source the local engine takes: a task reads its block's range of an indexable source itself
(a datasets Dataset, a torch map-style Dataset, JSONL and text files scanned first); the items of
a source that lives in this process (a list, a generator, an iterable dataset) are read here, in
block order, and each block goes to the object store once (one ``ray.put`` per block, not per
task, and at most the blocks in flight at a time: a generator is never read further ahead).
``map`` runs in the tasks.

Ray tasks, not Ray Data: a block of our plan is already the unit Ray should schedule (a fixed
range of source items that becomes fixed shard names), so a task per block maps onto it one to
one. Ray Data would cut the rows into its own blocks (sizes it chooses at run time), carry
every row through its object store, and write files with its own names and no atomic publish.

Failures: a task whose worker dies, or that raises an ``OSError`` (a flaky read or upload), is
retried by Ray (:data:`MAX_RETRIES`); a retried block rewrites the same names with the same bytes
and its record is written last, so nothing is duplicated or lost. Any other error (bad data, a
schema error), or the driver stopped (Ctrl-C), sets the build's abort flag (:class:`AbortFile`):
the tasks in flight see it at their next check and stop themselves, removing what they wrote, and
the driver waits for them. No task is ever ``ray.cancel``-ed: Ray 2.60 aborts the driver process
when a task completes just as it is cancelled. The finished blocks' records stay, and a rerun
resumes like a local build (a generator is read again from its start, its finished blocks
skipped).

``ray`` is imported when a Ray build starts, never by ``import build_shards``.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
import uuid
from collections.abc import Iterator
from typing import Any

from build_shards.engines.base import BlockTask, Output, Report, record_bytes, write_block
from build_shards.errors import BuildWorkerError
from build_shards.sources import JsonlSource, Source, TextSource
from build_shards.write.blocks import Aborted, BlockJob
from build_shards.write.paths import BUILD_DIR, TMP_MARK
from build_shards.write.records import BlockRecord
from wdsloader.io.storage import join

log = logging.getLogger("build_shards")

MAX_RETRIES = 3  # attempts after the first, per block (a dead worker or an OSError)
RETRY_EXCEPTIONS: list[type[BaseException]] = [OSError]  # transient; other errors are the data's
INFLIGHT_PER_CPU = 2  # tasks submitted ahead per CPU of the cluster
STOP_WAIT_S = 60.0  # seconds to wait for the tasks in flight to stop once the build is aborted
ABORT_POLL_S = 0.2  # a task looks at the abort flag at most this often (a request on S3)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "engine='ray' needs Ray: pip install 'wdsloader[ray]' (or pip install ray)"
        ) from None
    return ray


class AbortFile:
    """A build's abort flag: a file under the output's ``_build/`` (every task reaches the
    output) that the driver writes when the build fails or is stopped. Tasks poll it (at most
    every :data:`ABORT_POLL_S` seconds) and stop themselves; its name holds ``TMP_MARK``, so a
    rerun clears one a killed driver left."""

    def __init__(self, out: Output) -> None:
        self.url, self.storage_options = out.url, out.storage_options
        self.name = join(BUILD_DIR, f"abort{TMP_MARK}{uuid.uuid4().hex}")
        self._fs: Any = None
        self._path = ""
        self._next = 0.0
        self._set = False

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fs=None, _path="", _next=0.0, _set=False)

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            from wdsloader.io.storage import url_to_fs

            self._fs, root = url_to_fs(self.url, self.storage_options)
            self._path = join(root, self.name)
        return self._fs, self._path

    def is_set(self) -> bool:
        """Whether the driver aborted the build (looked up at most every ABORT_POLL_S)."""
        now = time.monotonic()
        if not self._set and now >= self._next:
            fs, path = self._open()
            self._next = now + ABORT_POLL_S
            fs.invalidate_cache(path)  # a listing cached by the filesystem would hide the flag
            self._set = bool(fs.exists(path))
        return self._set

    def set(self) -> None:
        fs, path = self._open()
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, b"aborted\n")

    def remove(self) -> None:
        fs, path = self._open()
        try:
            fs.rm_file(path)
        except (FileNotFoundError, OSError):
            pass


def ray_write_block(
    job: BlockJob,
    url: str,
    storage_options: Any,
    task: BlockTask,
    items: bytes | None,
    abort: AbortFile,
) -> BlockRecord:
    """The body of a block's Ray task: open the output and write the block (its ``items``, the
    pickled list the driver put in the object store, or else its range of the source); stop at
    once when the build is aborted."""
    from wdsloader.io.storage import url_to_fs

    if abort.is_set():
        raise Aborted(f"block {task.block} not started: the build was stopped")
    if items is not None:  # a copy the task owns (arrays writable for map), not a read-only view
        task = dataclasses.replace(task, items=pickle.loads(items))  # noqa: S301 - our driver's
    fs, root = url_to_fs(url, storage_options)
    return write_block(job, fs, root, task, abort=abort)


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
        """The source with its files scanned (JSONL, text: one task per file, then each block
        task reads its range); any other source as it is (a list, a generator or an iterable
        dataset is read by the driver, block by block)."""
        if isinstance(src, (JsonlSource, TextSource)):
            return self._scan_files(src)
        return src

    def _scan_files(self, src: JsonlSource | TextSource) -> Source:
        from build_shards.sources.ranged import RangedFileSource, scan_file

        ray = self._connect()
        scan = ray.remote(scan_file).options(
            max_retries=MAX_RETRIES, retry_exceptions=RETRY_EXCEPTIONS
        )
        refs = [scan.remote(src.kind, path) for path in src.files]
        # a failed scan leaves the others running, never cancelled: they only read
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
        abort = AbortFile(out)
        inflight: dict[Any, int] = {}
        try:
            for task in tasks:
                items_ref = None
                if task.items is not None:  # read here, in block order: one put per block
                    data = pickle.dumps(list(task.items), protocol=pickle.HIGHEST_PROTOCOL)
                    items_ref = ray.put(data)
                    task = dataclasses.replace(task, items=None)
                    del data
                args = (job_ref, out.url, out.storage_options, task, items_ref, abort)
                inflight[remote.remote(*args)] = task.block
                del items_ref  # the task holds it: freed from the store once the task is done
                while len(inflight) >= limit:
                    yield from self._finished(ray, inflight, report)
            while inflight:
                yield from self._finished(ray, inflight, report)
        except BaseException:
            _stop(ray, abort, list(inflight))
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


def _stop(ray: Any, abort: AbortFile, refs: list[Any]) -> None:
    """Set the abort flag and wait (a while) until the tasks ``refs`` stopped themselves, so that
    no task of this build still writes once the driver returned. Nothing is cancelled."""
    if not refs:
        return
    try:
        abort.set()
    except OSError as exc:  # the tasks then run to their end: their blocks are kept for a rerun
        log.warning("could not write the abort flag %s: %s", abort.name, exc)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_S)
    if running:
        log.warning("%d Ray tasks of this build still run after %.0f s", len(running), STOP_WAIT_S)
    else:
        abort.remove()
