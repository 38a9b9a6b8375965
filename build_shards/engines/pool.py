"""Worker processes of a local build: the parent's loop over blocks and the worker side.

Workers are started with ``forkserver`` where the platform has it, else ``spawn``: both are safe
with threads in the parent (a fork is not). The fork server is started once per process with this
module (numpy, the encoders, the tar writer) imported, and torch or ``datasets`` when this process
has them, so each worker is a fork of it instead of a new interpreter importing them again
(~0.45 CPU-s a worker here, more than 1 CPU-s with torch). Either way a worker re-imports
the main script, so a script that calls ``build_shards`` at top level, without an
``if __name__ == "__main__":`` guard, would start a second build in each worker: the build
refuses such a call before it starts (:mod:`build_shards.engines.main_guard`), and where that cannot be
seen (no readable source), :func:`refuse_reimported_main` stops such a worker at once, and the
parent reports the dead worker as one :class:`~build_shards.errors.BuildWorkerError` that says
to add the guard.

Nothing the parent sends a worker can block it for long: the job (which may hold an in-memory
source) is pickled once to a file each worker loads, so only a few small objects go through the
pipe that starts a worker; the abort flag and the table of running blocks are lock-free shared
memory, so a worker killed at any point cannot leave a lock held. A dead worker (killed by a
signal, out of memory, or stopped at start) surfaces within a second as BuildWorkerError naming
the block it was building; blocks finished before stay recorded for a rerun.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import multiprocessing
import os
import pickle
import queue as _queue
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from build_shards.engines.base import BlockTask, write_block
from build_shards.errors import BuildError, BuildWorkerError
from build_shards.write.blocks import BlockJob
from build_shards.write.paths import BUILD_DIR, remove_quietly
from build_shards.write.records import BlockRecord
from build_shards.write.spool import spool_items
from wdsloader.io.storage import is_local, join

GUARD_HINT = (
    'if your script calls build_shards at top level, put it under `if __name__ == "__main__":` '
    "(worker processes start by re-importing the main script)"
)
_POLL_S = 0.5  # seconds between progress reports while waiting for blocks
# imported once by the fork server when this process has them, not by every worker (the main
# script, imported again by each worker, then finds them imported): torch alone costs a worker
# about 1 CPU-s
HEAVY_MODULES = ("torch", "datasets", "pandas")


def refuse_reimported_main() -> None:
    """Stop a worker process that is re-importing the main script and reached a build call.

    Under spawn and forkserver a new process runs the main script as ``__mp_main__`` before it
    can work; a ``build_shards`` call met then is the script's own top-level call, repeated.
    It must not run (it would start another build into the same output): the process exits
    with a one-line message, and the parent reports the dead worker with the guard hint.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    raise SystemExit(f"build_shards: not started in a worker process; {GUARD_HINT}")


class AbortFlag:
    """A flag the parent sets to stop every worker at its next check; lock-free shared memory,
    so a worker killed at any moment cannot leave it locked."""

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)


class RunningTable:
    """Which block each worker is building: ``(pid, block)`` per worker slot, in shared memory
    (block -1: idle). The parent reads it to name the block of a worker that died."""

    def __init__(self, ctx: Any, workers: int) -> None:
        self._cells = ctx.RawArray("q", 2 * workers)
        self._next = ctx.Value("i", 0)

    def claim(self) -> int:
        """A slot for the calling worker process."""
        with self._next.get_lock():
            slot = self._next.value
            self._next.value += 1
        self._cells[2 * slot] = os.getpid()
        self._cells[2 * slot + 1] = -1
        return slot

    def mark(self, slot: int, block: int) -> None:
        self._cells[2 * slot + 1] = block

    def running(self) -> dict[int, int]:
        """``{pid: block}`` of the workers building a block now."""
        cells = list(self._cells)
        pairs = zip(cells[0::2], cells[1::2], strict=True)
        return {pid: block for pid, block in pairs if pid and block >= 0}


# ------------------------------------------------------------------------------------------------
# Worker side
# ------------------------------------------------------------------------------------------------

_STATE: dict[str, Any] = {}


def init_worker(
    job_path: str,
    output: str,
    storage_options: dict[str, Any] | None,
    abort: AbortFlag,
    progress: Any,
    table: RunningTable,
) -> None:
    """ProcessPoolExecutor initializer: load the job, open the output filesystem once."""
    from wdsloader.io.storage import url_to_fs

    with open(job_path, "rb") as f:
        job = pickle.load(f)  # noqa: S301 - written by the parent process of this build
    fs, root = url_to_fs(output, storage_options)
    _STATE.update(
        job=job, fs=fs, root=root, abort=abort, progress=progress, table=table, slot=table.claim()
    )


def worker_block(task: BlockTask) -> BlockRecord:
    """Build one block in a worker: its range read from the source, or its ``items`` (a list or
    :class:`~build_shards.write.spool.SpooledItems`)."""
    queue = _STATE["progress"]
    report = None if queue is None else _QueueReport(queue)
    table: RunningTable = _STATE["table"]
    table.mark(_STATE["slot"], task.block)
    try:
        return write_block(
            _STATE["job"], _STATE["fs"], _STATE["root"], task, abort=_STATE["abort"],
            report=report,
        )  # fmt: skip
    finally:
        table.mark(_STATE["slot"], -1)


class _QueueReport:
    """Progress reports of a worker, sent to the parent through a queue."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def __call__(self, n: int, nbytes: int) -> None:
        self.queue.put((n, nbytes))


# ------------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------------


def run_pool(
    job: BlockJob,
    blocks: Iterator[BlockTask],
    workers: int,
    fs: Any,
    root: str,
    output_url: str,
    storage_options: dict[str, Any] | None,
    report: Callable[[int, int], None] | None,
) -> Iterator[tuple[int, BlockRecord]]:
    """Build ``blocks`` in ``workers`` processes; yields ``(block, record)`` as blocks finish.

    At most ``2 * workers`` blocks are in flight. A dead worker raises BuildWorkerError; any
    other error stops every worker at its next check and is raised.
    """
    check_picklable(job, workers)
    ctx = worker_context()
    job_path = _write_job(job, fs, root)
    abort, table = AbortFlag(ctx), RunningTable(ctx, workers)
    queue = ctx.Queue() if report is not None else None
    pool = cf.ProcessPoolExecutor(
        workers,
        mp_context=ctx,
        initializer=init_worker,
        initargs=(job_path, output_url, storage_options, abort, queue, table),
    )
    inflight: dict[cf.Future[Any], int] = {}
    try:
        try:
            for nxt in itertools.chain(blocks, [None]):
                if nxt is not None:
                    if nxt.items is not None:
                        nxt = dataclasses.replace(nxt, items=spool_items(nxt.items, fs, root))
                    inflight[_submit(pool, nxt)] = nxt.block
                limit = 2 * workers if nxt is not None else 1
                while len(inflight) >= limit:
                    timeout = _POLL_S if queue is not None else None
                    done, _ = cf.wait(inflight, timeout=timeout, return_when=cf.FIRST_COMPLETED)
                    _drain(queue, report)
                    for fut in done:
                        record = fut.result()
                        yield inflight.pop(fut), record
        except (BrokenProcessPool, BrokenPipeError):
            # the pool ends the other workers; once it is shut down every exit code is known
            processes = dict(getattr(pool, "_processes", None) or {})
            running = table.running()
            _shutdown(pool, queue, report, cancel=True)
            raise _worker_died(processes, running, sorted(inflight.values())) from None
    except BaseException:
        abort.set()
        _shutdown(pool, queue, report, cancel=True)
        raise
    else:
        _shutdown(pool, queue, report, cancel=False)
    finally:
        remove_quietly(job_path)  # every worker has loaded it (or is gone) once shut down


def worker_context() -> Any:
    """The multiprocessing context build workers start in: ``forkserver`` (its server preloads
    this module, and :data:`HEAVY_MODULES` this process imported, unless a server of this
    process is already running) where the platform has it, else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # only the server's imports: the main script is still imported by each worker (as under
    # spawn), so an unguarded script is stopped in the worker, with the guard hint; its
    # `import torch` then finds torch imported (once, by the server) instead of importing it
    heavy = [name for name in HEAVY_MODULES if name in sys.modules]
    ctx.set_forkserver_preload([__name__, *heavy])
    return ctx


def check_picklable(job: BlockJob, workers: int) -> None:
    """A BuildError unless the job's map, decoder and splitter can be sent to worker processes
    (checked for any ``workers > 1``, even when a build turns out to need one process)."""
    try:
        pickle.dumps((job.map_fn, job.decoder, job.splitter))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise BuildError(
            f"workers={workers} needs a picklable map (a module-level function, not a lambda or "
            f"closure): {exc}"
        ) from None


def _submit(pool: cf.ProcessPoolExecutor, task: BlockTask) -> cf.Future[Any]:
    try:
        return pool.submit(worker_block, task)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise BuildError(f"cannot send the source to worker processes: {exc}") from exc


def _write_job(job: BlockJob, fs: Any, root: str) -> str:
    """Pickle the job once to a file every worker loads (under the output's ``_build/`` when it
    is local, else in the system's temporary folder); its path."""
    folder = None
    if is_local(fs):
        folder = join(root, BUILD_DIR)
        os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="job-", suffix=".pkl", dir=folder)
    try:
        with open(fd, "wb") as f:
            pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        remove_quietly(path)
        raise BuildError(f"cannot send the source to worker processes: {exc}") from exc
    except BaseException:
        remove_quietly(path)
        raise
    return path


def _exit_codes(processes: dict[int, Any]) -> dict[int, int]:
    """``{pid: exit code}`` of the workers that have ended."""
    codes = {}
    for pid, proc in processes.items():
        code = proc.exitcode
        if code is not None:
            codes[pid] = code
    return codes


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _worker_died(
    processes: dict[int, Any], running: dict[int, int], inflight: list[int]
) -> BuildWorkerError:
    """The error for a worker that died: which worker, how, and the block it was building
    (``processes``: the pool's ``{pid: Process}``, ``running``: ``{pid: block}``)."""
    codes = _exit_codes(processes)
    # the pool terminates the other workers once one died: the first cause is not a SIGTERM
    dead = [pid for pid, code in codes.items() if code != -signal.SIGTERM] or list(codes)
    pid = dead[0] if dead else None
    what = "a build worker died"
    if pid is not None:
        what = f"a build worker (pid {pid}) died ({_describe_exit(codes[pid])})"
        if codes[pid] == -signal.SIGKILL:
            what += " (out of memory? try fewer workers or a smaller block_size)"
    if pid in running:
        what += f" while building block {running[pid]}"
    elif running:
        what += f" while blocks {sorted(running.values())} were being built"
    else:
        what += " before it took a block"
    return BuildWorkerError(
        f"{what}; {GUARD_HINT}. Blocks finished before are kept: a rerun with the same options "
        f"resumes (unfinished: blocks {inflight})"
    )


def _shutdown(
    pool: cf.ProcessPoolExecutor,
    queue: Any,
    report: Callable[[int, int], None] | None,
    *,
    cancel: bool,
) -> None:
    """Shut the pool down, reading the progress queue meanwhile: a worker exits only once its
    reports are flushed into the queue's pipe, which must not stay full. Every report is passed
    on (in this thread) once the workers are gone."""
    if queue is None:
        pool.shutdown(wait=True, cancel_futures=cancel)
        return
    got: list[tuple[int, int]] = []
    stop = threading.Event()
    reader = threading.Thread(target=_collect, args=(queue, got, stop), daemon=True)
    reader.start()
    try:
        pool.shutdown(wait=True, cancel_futures=cancel)
    finally:
        stop.set()
        reader.join()
    for n, nbytes in got:
        if report is not None:
            report(n, nbytes)
    _drain(queue, report)  # what the workers flushed as they exited


def _collect(queue: Any, got: list[tuple[int, int]], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            got.append(queue.get(timeout=0.05))
        except _queue.Empty:
            continue


def _drain(queue: Any, report: Callable[[int, int], None] | None) -> None:
    """Pass every progress report waiting in ``queue`` to ``report``."""
    if queue is None or report is None:
        return
    while True:
        try:
            n, nbytes = queue.get_nowait()
        except _queue.Empty:
            return
        report(n, nbytes)
