"""The batch reader's groups of batches read ahead of the decoders, within a byte budget.

Locally a group is read on one thread, one after the other. Remotely a group's read is started
(its requests queued on the store's pool) on one thread, in order, and waited for on another:
the next groups' requests queue behind the current group's, so the link is not idle while a
group's last answers arrive and while the next one's requests are made, and the first group's
requests (the first batch's) still go first.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.decode.batch import RawBatch
from wdsloader.io.store import Store
from wdsloader.stream.first_read import SERVES, Prefetch

if TYPE_CHECKING:
    from wdsloader.stream.reader import BatchReader, GroupRead

__all__ = ["ReadAhead", "groups"]


def groups(
    batches: Sequence[np.ndarray],
    head: int,
    group: int,
    second: int | None = None,
    cap_samples: int | None = None,
) -> Iterator[list[np.ndarray]]:
    """``batches`` in groups, the first of ``head`` batches, the second of ``second`` (default
    ``group``), then of ``group``: each computed only when asked for (a plan's sequence
    computes its batches when sliced), so nothing of the epoch is held beyond the group read
    and the group ahead. With ``cap_samples``, the groups after the first hold at most as many
    batches as fit in that many samples (at least one; the first batch's size counts)."""
    n = len(batches)
    start, size = 0, head
    sizes = iter((group if second is None else second,))
    while start < n:
        taken = list(batches[start : start + size])
        yield taken
        if cap_samples is not None and start == 0 and taken:
            group = max(1, min(group, cap_samples // max(1, len(taken[0]))))
            sizes = iter((group if second is None else min(second, group),))
        start, size = start + size, next(sizes, group)


class ReadAhead:
    """The reads of ``groups`` of batches, each group taken from the iterator (so computed)
    when it is submitted; the buffers come from the reader's :class:`BufferPool` (kept from
    pass to pass), so a group's buffer is reused once the caller dropped that group's batches
    and nothing it yielded refers to them.

    At least one group is read ahead of the group handed out; remotely, more while the
    groups read ahead and not handed out take at most ``budget`` bytes (estimated from the
    manifest's mean sample size), so that the link stays busy while batches are decoded and
    memory stays bounded. With ``pipelined`` (a remote store) each group's read is started on
    the read thread, its requests queued on the store's pool behind those of the groups before
    it, and waited for on a second thread (``wdsloader-join``), so that the reads of the groups
    ahead overlap. :meth:`close` (always call it) closes the store's files once the reads under
    way are over."""

    def __init__(
        self,
        reader: BatchReader,
        groups: Iterator[Sequence[np.ndarray]],
        budget: int = 0,
        prefetch: Prefetch | None = None,
        pipelined: bool = False,
    ) -> None:
        self.reader = reader
        self.pool = reader.pool
        self.budget = budget
        self._groups = groups
        self._closer = _StoreCloser(reader.store)  # bound now: close may run at interpreter exit
        self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdsloader-read")
        self._joins = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdsloader-join")
            if pipelined
            else None
        )
        # (the group's batches, its bytes, the start of its read when pipelined)
        self._pending: deque[tuple[Future[list[RawBatch]], float, Future[GroupRead] | None]]
        self._pending = deque()
        self._last = 0.0  # bytes of the last group submitted
        # the bytes the first group's read holds for the second's (its window)
        self._prefetch = prefetch
        self._submitted = 0
        self._done = False
        # reads started and not handed out (cancelled by close), and whether close ran
        self._lock = threading.Lock()
        self._reads: set[GroupRead] = set()
        self._closed = False
        try:
            if prefetch is not None:  # the first read spans gaps of the next reads' samples only
                firsts = (next(groups, None) for _ in range(SERVES + 1))
                ahead = [g for g in firsts if g is not None]
                later = [b for g in ahead[1:] for b in g]
                prefetch.window = np.concatenate(later) if later else None
                self._groups = itertools.chain(ahead, groups)
            self._top_up()
        except BaseException:
            self.close()  # over: the store's last read-ahead to end closes it
            raise

    def _bytes(self, group: Sequence[np.ndarray]) -> float:
        return sum(len(b) for b in group) * self.reader.sample_bytes

    def _top_up(self) -> None:
        """Submit groups while none is pending or the pending ones leave room in the budget
        for one more (of the size of the last one submitted): a group is taken from the
        iterator (computed) only when it is submitted."""
        while not self._done:
            pending = sum(b for _, b, _ in self._pending)
            if self._pending and pending + self._last > self.budget:
                return
            group = next(self._groups, None)
            if group is None:
                self._done = True
                return
            self._last = self._bytes(group)
            prefetch = self._prefetch if self._submitted <= SERVES else None
            reader, started = self.reader, None
            if self._joins is None:
                future = self._threads.submit(reader.read, group, self.pool, True, prefetch)
            else:
                # the first group (the first batch's bytes) is read alone, at the link's full
                # rate: the second's requests start once it is over
                first = self._pending[0][0] if self._submitted == 1 and self._pending else None
                started = self._threads.submit(self._start, first, group, prefetch)
                future = self._joins.submit(self._join, started)
            self._pending.append((future, self._last, started))
            self._submitted += 1

    @property
    def groups_ahead(self) -> int:
        """Groups submitted and not handed out yet."""
        return len(self._pending)

    def next_group(self) -> list[RawBatch] | None:
        """The next group's batches (None after the last), and more groups' reads started.
        The caller drops its references to the group before asking for the next, so that its
        buffer can serve a later read."""
        if not self._pending:
            return None
        future, _, _ = self._pending.popleft()
        raws = future.result()
        self._top_up()
        return raws

    def close(self) -> None:
        """Stop reading ahead: an abandoned iteration does not wait for the reads under way
        (those not started are cancelled, and so are the requests of reads started and not
        sent yet); the store's files are closed once they are over. No cancel_futures: at
        interpreter exit its ``queue.Empty`` lookup fails on a torn-down module."""
        pending = list(self._pending)
        self._pending.clear()
        self._done = True
        self._threads.shutdown(wait=False)
        if self._joins is None:
            started = [f for f, _, _ in pending if not f.cancel()]  # at most one runs
            if not started:
                self._closer()
            else:
                started[-1].add_done_callback(self._closer)
            return
        for future, _, start in pending:
            future.cancel()
            if start is not None:
                start.cancel()
        with self._lock:  # a read started from now on cancels its own requests
            self._closed = True
            reads, self._reads = self._reads, set()
        for read in reads:
            read.cancel()  # its requests not sent yet: none will be
        starts = [s for _, _, s in pending if s is not None]
        try:  # after the join under way, on its thread: the consumer does not wait
            self._joins.submit(_close_after, starts, self._closer)
        except RuntimeError:  # the interpreter is exiting: the files go with the process
            pass
        self._joins.shutdown(wait=False)

    def _start(
        self,
        before: Future[list[RawBatch]] | None,
        group: Sequence[np.ndarray],
        prefetch: Prefetch | None,
    ) -> GroupRead:
        """The read of ``group`` started (on the read thread) once ``before`` is over (None:
        now); cancelled at once when the read-ahead is closed."""
        if before is not None:
            wait([before])
        read = self.reader.start(group, self.pool, True, prefetch)
        with self._lock:
            if not self._closed:
                self._reads.add(read)
                return read
        read.cancel()
        return read

    def _join(self, started: Future[GroupRead]) -> list[RawBatch]:
        """The batches of a group whose read was started (on the join thread)."""
        read = started.result()
        try:
            return read.result()
        finally:
            with self._lock:
                self._reads.discard(read)


def _close_after(starts: list[Future[GroupRead]], closer: _StoreCloser) -> None:
    """Close the store once the reads ``starts`` started (it waits for their requests in
    flight)."""
    wait(starts)
    closer()


class _StoreCloser:
    """Close a store's files when the last read of an iteration is over (a Future callback),
    unless another read-ahead of the store is open then (a pass started while an abandoned
    one still waited for its read: its requests are queued on the store's pool, and close
    would cancel them); the last one to end closes it. Nothing at interpreter exit, when the
    process's files go anyway."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.finalizing = sys.is_finalizing
        self._open, self._lock = _OPEN, _OPEN_LOCK  # bound now: it may run at interpreter exit
        self._over = False
        with self._lock:
            self._open[store] = self._open.get(store, 0) + 1

    def __call__(self, _future: Future[Any] | None = None) -> None:
        if self.finalizing():
            return
        with self._lock:
            if self._over:
                return
            self._over = True
            left = self._open.pop(self.store, 1) - 1
            if left:
                self._open[self.store] = left
        if not left:
            self.store.close()


# the read-ahead instances of each store not over yet (their closer not run)
_OPEN: weakref.WeakKeyDictionary[Store, int] = weakref.WeakKeyDictionary()
_OPEN_LOCK = threading.Lock()
