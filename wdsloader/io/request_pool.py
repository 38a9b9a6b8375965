"""The one thread pool of a :class:`~wdsloader.io.fetch.ShardStore`: its remote requests (and
downloads, and the second half of a large local read), queued in the order they are submitted.

:class:`RequestPool` is the part of ``ShardStore`` that does this job; it relies on the store's
state, declared below. Work is queued under the store's lock and waited for without it, so the
requests of a read started while another read waits queue behind that one's (the link stays
busy at its end) and neither holds the lock across the network wait. The pool has the tuned
concurrency; it is made anew for a new tuning only when no work is queued, so that two pools'
requests are never in flight together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from wdsloader.io.tuning import Tuning

__all__ = ["RequestPool", "wait_all"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def wait_all(futures: Sequence[Future[_R]]) -> list[_R]:
    """The results of ``futures`` in order; at the first error, those not started are
    cancelled and the error is raised once none of them runs. A future cancelled where no
    thread will run it (the store closed: its pool's queue cancelled) counts as over: its
    ``CancelledError`` is raised, where ``concurrent.futures.wait`` would wait for ever."""
    over = threading.Condition()
    left, failed = [len(futures)], [False]

    def one_over(f: Future[_R]) -> None:  # also called by cancel(), on the cancelling thread
        with over:
            left[0] -= 1
            failed[0] = failed[0] or (not f.cancelled() and f.exception() is not None)
            over.notify_all()

    for f in futures:
        f.add_done_callback(one_over)
    with over:
        over.wait_for(lambda: left[0] == 0 or failed[0])
    if left[0]:
        for f in futures:
            f.cancel()
        with over:
            over.wait_for(lambda: left[0] == 0)
    errors = [f.exception() for f in futures if not f.cancelled()]
    error = next((e for e in errors if e is not None), None)
    if error is not None:  # the first error, before a request cancelled because of it
        raise error
    return [f.result() for f in futures]


class RequestPool:
    """A store's thread pool of requests (``ShardStore`` mixes it in)."""

    # the store's state (see ShardStore._init_runtime)
    _lock: threading.RLock
    _stats_lock: threading.Lock
    _pool: ThreadPoolExecutor | None
    _queued: int  # work submitted to the pool and not over

    def tuning(self) -> Tuning:
        raise NotImplementedError

    def _thread_pool(self, threads: int | None = None) -> ThreadPoolExecutor:
        """The store's one thread pool (taken under the lock), with ``threads`` threads (None:
        as it is; when made now, the tuned concurrency)."""
        pool = self._pool
        idle = self._queued == 0  # resized only then: never two pools' requests in flight
        if pool is not None and threads is not None and pool._max_workers != threads and idle:
            pool.shutdown(wait=False)  # tuned since
            pool = None
        if pool is None:
            count = threads if threads is not None else max(1, self.tuning().concurrency)
            pool = self._pool = ThreadPoolExecutor(count, "wdsloader-fetch")
        return pool

    def _run_all(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(x) for x in items]`` on the thread pool; raises the first error once none runs."""
        if len(items) <= 1 or self.tuning().concurrency == 1:
            return [fn(x) for x in items]
        return wait_all(self._submit_all(fn, items))

    def _submit_all(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[Future[_R]]:
        """``fn(x)`` of each of ``items`` queued on the thread pool (of the tuned concurrency),
        behind the work queued there before; nothing waits for it here."""
        with self._lock:
            pool = self._thread_pool(max(1, self.tuning().concurrency))
            futures = [pool.submit(fn, x) for x in items]
            with self._stats_lock:
                self._queued += len(futures)
        for future in futures:
            future.add_done_callback(self._one_over)
        return futures

    def _one_over(self, _future: Future[Any]) -> None:
        with self._stats_lock:
            self._queued -= 1
