"""Thread workers (``WorkerOptions(mode="thread")``): the per-worker plans of a loader run on
threads of its process instead of DataLoader worker processes.

Each thread runs :meth:`~wdsloader.stream.dataset.ShardStreamDataset.iter_worker` on a copy of
the dataset of its own, made by :func:`worker_copy` as a worker process would get one: its own
store (files, locks, I/O counters), reader (buffer pool, read-ahead thread) and decoders, and
the same shared parts (the plan, the control block with epoch, resume point and counters, the
decoder registry, the collate function, the manifest). Nothing is pickled. The main thread
takes the workers' batches in turn, as torch's DataLoader does (worker 0's first batch, worker
1's first, ..., a worker with none left passed over): the order :mod:`~wdsloader.stream.replay`
walks and resume counts on.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory

from wdsloader.stream.collected import close_when_collected
from wdsloader.stream.exit_stop import forget, stop_at_exit

if TYPE_CHECKING:
    from wdsloader.stream.dataset import ShardStreamDataset

__all__ = ["ThreadWorkers", "start_threads", "worker_copy"]

THREAD_NAME = "wdsloader-worker"
_BATCH, _END, _ERROR = range(3)


def worker_copy(dataset: ShardStreamDataset) -> ShardStreamDataset:
    """A copy of ``dataset`` for one worker thread: what a worker process holds of its own
    (store runtime, reader, decoders, per-pass state) is new; the rest is shared."""
    clone = copy.copy(dataset)
    # a store copies as it pickles: root and options kept, files, locks and counters new
    clone.store = copy.copy(dataset.store)
    close_when_collected(clone, clone.store)
    clone._last_skip = ""
    clone._collate_ns = 0
    clone._decoders(dataset.loader_config.gather)
    return clone


def start_threads(
    dataset: ShardStreamDataset,
    free: list[list[ShardStreamDataset | None]],
    prefetch: int,
    pin: bool = False,
) -> ThreadWorkers:
    """The thread workers of one iteration over ``dataset``, on copies of it that an earlier
    iteration left in ``free`` (new ones when none are left: another iteration runs); they go
    back to ``free`` when the iteration is closed."""
    none: list[ShardStreamDataset | None] = [None] * dataset.config.num_workers
    copies = free.pop() if free else none
    return ThreadWorkers(dataset, copies, prefetch, pin, done=free.append)


class ThreadWorkers:
    """The batches of ``len(copies)`` plan workers, each made on a thread of this process from
    its copy of the dataset (None: made by :func:`worker_copy` on that thread), at most
    ``prefetch`` ready per worker; yielded in turn. :meth:`close` (also called at the end and
    on an error; the loader calls it when its iteration is closed) stops the threads and waits
    for them; ``done(copies)`` is then
    called with the copies, for the next iteration."""

    def __init__(
        self,
        dataset: ShardStreamDataset,
        copies: list[ShardStreamDataset | None],
        prefetch: int,
        pin: bool = False,
        done: Any = None,
    ) -> None:
        self._dataset, self._copies, self._pin, self._done = dataset, copies, pin, done
        self._stop = threading.Event()
        self._finalizing = sys.is_finalizing  # bound now: close may run at interpreter exit
        stop_at_exit(self)
        self._queues: list[queue.Queue[tuple[int, Any]]] = [
            queue.Queue(maxsize=prefetch) for _ in copies
        ]
        self._alive = [True] * len(copies)
        self._turn = 0
        self._threads = [
            threading.Thread(target=self._run, args=(w,), name=f"{THREAD_NAME}-{w}", daemon=True)
            for w in range(len(copies))
        ]
        for thread in self._threads:
            thread.start()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        n = len(self._alive)
        while any(self._alive) and not self._stop.is_set():
            w, self._turn = self._turn, (self._turn + 1) % n
            if not self._alive[w]:
                continue
            kind, value = self._queues[w].get()
            if kind == _BATCH:
                return value
            self._alive[w] = False
            if kind == _ERROR:
                self.close()
                _reraise(*value)
        self.close()
        raise StopIteration

    def _run(self, worker: int) -> None:
        """Worker ``worker``'s thread: its batches into its queue, then the end (or the error
        that ended it); returns early once :meth:`close` was called."""
        out = self._queues[worker]
        try:
            clone = self._copies[worker]
            if clone is None:
                clone = self._copies[worker] = worker_copy(self._dataset)
            batches = clone.iter_worker(worker)
            try:
                for batch in batches:
                    if self._pin:
                        batch = pin_memory(batch)
                    if self._stop.is_set():
                        return
                    self._put(out, (_BATCH, batch))
                    del batch
                    if self._stop.is_set():
                        return
            finally:
                batches.close()  # here: a generator is closed by the thread that runs it
            self._put(out, (_END, None))
        except BaseException as exc:  # noqa: BLE001 - every error is the loop's to raise
            wrapped = ExceptionWrapper(where=f"in DataLoader worker thread {worker}")
            self._put(out, (_ERROR, (wrapped, exc)))

    def _put(self, out: queue.Queue[tuple[int, Any]], item: tuple[int, Any]) -> None:
        """Hand ``item`` to the loop; once :meth:`close` was called, only if there is room (it
        made room for one put under way, and takes nothing more)."""
        if not self._stop.is_set():
            out.put(item)
            return
        with contextlib.suppress(queue.Full):
            out.put_nowait(item)

    def close(self, timeout: float | None = None) -> None:
        """Stop the threads (each finishes the batch it is making) and wait for them, at most
        ``timeout`` seconds in all; nothing once the interpreter finalizes, where daemon threads
        end with the process (and may never run again to be joined)."""
        if self._stop.is_set() or self._finalizing():
            return
        self._stop.set()
        forget(self)
        for q in self._queues:  # a thread waiting to put a batch: room for it (this is the
            while not q.empty():  # only consumer: a queue that is not empty has an item)
                q.get_nowait()
        end = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        for thread in self._threads:
            if thread is not me:
                thread.join(None if end is None else max(0.0, end - time.monotonic()))
        for q in self._queues:  # what the threads put meanwhile: no batch outlives close
            while not q.empty():
                q.get_nowait()
        if self._done is not None and not any(
            t.is_alive() for t in self._threads if t is not me
        ):  # copies a thread still uses (the timeout passed) are not handed on
            self._done(self._copies)


def _reraise(wrapped: ExceptionWrapper, original: BaseException) -> None:
    """Raise the error of a worker thread as torch raises a worker process's (its type, a
    message naming the worker, the original traceback), the original as its cause."""
    try:
        wrapped.reraise()
    except BaseException as exc:  # noqa: BLE001 - re-raised with its cause
        raise exc from original
