"""Closing the store of a dataset once the dataset is collected, off the collecting thread.

A ``weakref.finalize`` callback runs in whichever thread the collection happens to run in, and
that thread may hold the very locks that closing a store takes: a read thread left over from an
iteration that raised, inside ``submit`` on its store's thread pool, holds that pool's lock (and
the executors' global lock) when a collection inside ``submit`` finds the dataset gone; closing
the store there waited for that lock for ever, and every other executor of the process with it.
So the callback only queues the store (``SimpleQueue.put`` is safe in a finalizer) and one
daemon thread of the process closes it.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import weakref
from typing import Any

from wdsloader.io.store import Store

log = logging.getLogger(__name__)

__all__ = ["close_when_collected", "closed_so_far"]

THREAD_NAME = "wdsloader-closer"

_pending: queue.SimpleQueue[Store | threading.Event] = queue.SimpleQueue()
_start_lock = threading.Lock()
_started_in: int | None = None  # the pid whose closer thread runs


def close_when_collected(owner: Any, store: Store) -> None:
    """Close ``store`` (its open files and threads) once ``owner`` is collected, on this
    process's closer thread; nothing at interpreter exit, when the process's files go anyway.
    A process forked after the call closes such stores only once it registers one itself."""
    _ensure_thread()
    weakref.finalize(owner, _pending.put, store).atexit = False


def closed_so_far(timeout: float | None = None) -> bool:
    """Wait until the stores of the datasets collected so far are closed (at most
    ``timeout`` seconds); False if they are not by then."""
    _ensure_thread()
    done = threading.Event()
    _pending.put(done)
    return done.wait(timeout)


def _ensure_thread() -> None:
    global _started_in
    pid = os.getpid()
    if _started_in == pid:
        return
    with _start_lock:
        if _started_in != pid:
            threading.Thread(target=_close_queued, name=THREAD_NAME, daemon=True).start()
            _started_in = pid


def _close_queued() -> None:
    while True:
        item = _pending.get()
        if sys.is_finalizing():
            return
        if isinstance(item, threading.Event):
            item.set()
            continue
        try:
            item.close()
        except Exception:  # a store that fails to close leaves what the process exit frees
            log.warning("closing the store of a collected dataset failed", exc_info=True)
        del item


def _after_fork_in_child() -> None:
    global _start_lock
    _start_lock = threading.Lock()  # a lock held by a parent's thread at the fork stays held


os.register_at_fork(after_in_child=_after_fork_in_child)
