"""A DataLoader worker process ends when the training process that started it is gone.

torch's worker loop checks its parent only between batches: a worker in the middle of a batch
(a read from a server that never answers, a long decode) runs on as an orphan after the
training process was killed (SIGKILL, a crash, the OOM killer), holding memory, descriptors,
connections and its shard-cache ledger; and a worker whose loop did return still waits at exit
for its read threads (``concurrent.futures`` joins them). :func:`watch_parent` starts one
daemon thread per worker process that ends the process, with ``os._exit``, once its parent is
gone (the process was given another parent, or the process that started it ended: under
``forkserver`` that is not its parent): nothing it makes can be delivered any more, and
the kernel releases what it held (descriptors, ``flock`` of ledgers, sockets, shared memory), as
for a killed process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time

__all__ = ["ORPHAN_EXIT_CODE", "POLL_S", "watch_parent"]

POLL_S = 0.25
"""How often a worker checks that its parent lives (a ``getppid`` call)."""
ORPHAN_EXIT_CODE = 1
"""The exit status of a worker that ended because its parent was gone."""
_LOG_GRACE_S = 2.0  # the warning's write may block (a full pipe): the exit does not wait for it

log = logging.getLogger(__name__)
_lock = threading.Lock()
_watched: int | None = None  # the process whose watch runs (a forked child has none)


def watch_parent() -> None:
    """In a DataLoader worker process: end this process soon after its parent is gone (once
    per process; later calls do nothing)."""
    global _watched
    with _lock:
        if _watched == os.getpid():
            return
        _watched = os.getpid()
        owner = multiprocessing.parent_process()
        thread = threading.Thread(
            target=_watch,
            args=(os.getppid(), None if owner is None else owner.pid),
            name="wdsloader-parent-watch",
            daemon=True,
        )
        thread.start()


def _watch(parent: int, owner: int | None) -> None:
    """Wait while ``parent`` is this process's parent and ``owner`` (the process that started
    it; under forkserver not its parent) lives, then end the process."""
    while not _gone(parent, owner):
        time.sleep(POLL_S)
    timer = threading.Timer(_LOG_GRACE_S, os._exit, (ORPHAN_EXIT_CODE,))
    timer.daemon = True
    timer.start()
    log.warning(
        "DataLoader worker process %d: its parent process %d is gone; exiting",
        os.getpid(), parent,
    )  # fmt: skip
    os._exit(ORPHAN_EXIT_CODE)


def _gone(parent: int, owner: int | None) -> bool:
    """Whether this process was given another parent than ``parent`` or ``owner`` ended (also
    when it ended before this process started watching it, and when it is a zombie: ended,
    not reaped yet by a parent that does not wait for it)."""
    if os.getppid() != parent:
        return True
    if owner is None or owner == parent:
        return False
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists (another user's)
        pass
    return _zombie(owner)


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended and waits to be reaped (Linux's /proc; elsewhere
    False)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")
