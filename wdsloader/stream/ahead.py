"""Batches made ahead on a thread of the training process (``num_workers=0``).

Without worker processes the training loop's own process reads and decodes; made in the loop's
thread, every batch's decode adds to the step. Made on a thread of their own, the next batch is
decoded while the step runs: wholly in parallel where the step releases the GIL (numpy and torch
kernels, a GPU launch, I/O), and no slower where it does not. The thread blocks (no polling)
while the batches ahead wait to be taken, and wakes once per batch taken.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from wdsloader.stream.exit_stop import forget, stop_at_exit

T = TypeVar("T")

DECODE_AHEAD = 1
# how long closing a generator waits for the batch in the making (past any read's deadline): a
# read that never returns leaves its thread running, never the consumer blocked for ever
CLOSE_JOIN_S = 120.0
log = logging.getLogger(__name__)
"""Batches made and waiting at most (one more may be in the making): the loop takes batch k
while batch k + 1 waits and batch k + 2 is decoded."""


class Ahead(Generic[T]):
    """The items of ``source`` made on a thread, at most ``depth`` waiting; iterate it in one
    thread and :meth:`close` it (always: it stops the thread and closes ``source`` there).

    An exception of ``source`` is raised by ``next`` after the items made before it.
    """

    def __init__(self, source: Iterator[T], depth: int = DECODE_AHEAD, name: str = "ahead"):
        self._source = source
        self._depth = max(1, depth)
        self._items: deque[T] = deque()
        self._cond = threading.Condition()
        self._stopped = False  # the consumer is gone: make nothing more
        self._done = False  # source exhausted, failed, or stopped
        self._error: BaseException | None = None
        self.made = 0  # items made so far (the thread's count)
        self._thread = threading.Thread(target=self._run, name=f"wdsloader-{name}", daemon=True)
        stop_at_exit(self)  # a thread frozen at exit inside torch's C++ code aborts
        self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        try:
            while not self._stopped:
                try:
                    item = next(self._source)
                except StopIteration:
                    break
                with cond:
                    while len(self._items) >= self._depth and not self._stopped:
                        cond.wait()
                    if self._stopped:
                        break
                    self._items.append(item)
                    self.made += 1
                    cond.notify_all()
                del item
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer's thread
            self._error = exc
        finally:
            close = getattr(self._source, "close", None)
            try:
                if close is not None:
                    close()  # the source's own clean-up, in the thread that ran it
            finally:
                with cond:
                    self._done = True
                    cond.notify_all()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        cond = self._cond
        with cond:
            while not self._items and not self._done:
                cond.wait()
            if self._items:
                item = self._items.popleft()
                cond.notify_all()
                return item
            error, self._error = self._error, None
        if error is not None:
            raise error
        raise StopIteration

    def close(self, timeout: float | None = None) -> None:
        """Stop making items, drop those waiting, and wait (at most ``timeout`` seconds) until
        the thread has closed the source (it finishes the item it is making first)."""
        with self._cond:
            self._stopped = True
            self._items.clear()
            self._cond.notify_all()
        forget(self)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()


def made_ahead(source: Iterator[Any], depth: int = DECODE_AHEAD) -> Iterator[Any]:
    """``source``'s items made on a thread (:class:`Ahead`), the thread stopped when this
    generator is closed or collected."""
    ahead = Ahead(source, depth, name="ahead")
    try:
        # not `yield from`: closing this generator would close ``ahead`` with no time limit
        for item in ahead:  # noqa: UP028
            yield item
    finally:
        ahead.close(timeout=CLOSE_JOIN_S)
        if ahead.alive:
            log.warning(
                "the decode-ahead thread is still in a batch %.0f s after its iteration was "
                "closed; it is left to finish and close its reads",
                CLOSE_JOIN_S,
            )
