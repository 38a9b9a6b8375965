"""Remote byte ranges read back to back into one buffer, each answer copied in as it arrives.

:func:`start_remote_into` is what :meth:`RemoteStore.start_joined
<wdsloader.io.remote_store.RemoteStore.start_joined>` reads with: the ranges merged and cut into
requests (:func:`remote_pieces`, as :func:`~wdsloader.io.remote_store.read_remote_ranges`
does), queued on the store's pool behind the requests of the reads started before (so a read
started while another is under way keeps the link busy at that one's end, and the earlier one's
requests still go first), each request's bytes copied straight to their places in the buffer by
the thread that fetched them. :meth:`RemoteRead.result` waits for them (no lock held: other
reads start meanwhile). A window's bytes are copied once, and each answer is dropped once
copied, so the buffer and the requests in flight are all a read holds.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from wdsloader.format import ShardInfo
from wdsloader.io.ranges import Request, merge_requests, unique_shards
from wdsloader.io.request_pool import wait_all

if TYPE_CHECKING:
    from wdsloader.io.fetch import ShardStore
    from wdsloader.io.retry import RemoteFiles

__all__ = ["RemoteRead", "remote_pieces", "start_remote_into", "verify_checksums"]

Segment = tuple[ShardInfo, int, int, list[int]]  # merged ranges: (shard, start, stop, request ids)
Cutting = tuple[int, int, int]  # one request of a segment: (segment index, start, stop)
# one request: (path, start, stop, [(where in the buffer, from, to) of the bytes it answers])
_Job = tuple[str, int, int, list[tuple[int, int, int]]]


def verify_checksums(store: ShardStore, reqs: list[Request]) -> None:
    """Each shard of ``reqs`` not checked yet by ``store``: its sha256 checked, when the
    store's options ask for it (``verify_checksum``)."""
    if store.options.verify_checksum:
        for rel, shard in unique_shards(reqs).items():
            if rel not in store._verified:
                store._check_digest(shard, store._hash_remote(shard))
                store._verified.add(rel)


def remote_pieces(
    store: ShardStore, reqs: list[Request]
) -> tuple[RemoteFiles, list[Segment], list[Cutting]]:
    """What a remote read of ``reqs`` asks for: ``store``'s client of shard bytes, the
    requests' ranges merged (overlapping or adjacent ranges of a shard) into segments, and the
    segments cut into requests of at most the store's tuned size, in order; each shard's
    sha256 checked first (once per store) when ``verify_checksum`` is set."""
    with store._lock:  # the one wait under it: a shard's first check (its reads wait anyway)
        remote = store._storage(data=True)
        verify_checksums(store, reqs)
    segments = merge_requests(reqs)
    step = store.tuning().request_bytes
    pieces = [
        (k, s, min(s + step, stop))
        for k, (_, start, stop, _) in enumerate(segments)
        for s in range(start, stop, step)
    ]
    return remote, segments, pieces


class RemoteRead:
    """A remote joined read under way (:func:`start_remote_into`): :meth:`result` is its buffer
    and where each range starts there, once every request is answered; or the first error
    (once the requests not started are cancelled and those running are over), as
    :meth:`~wdsloader.io.fetch.ShardStore.read_ranges` raises it. ``count`` adds the bytes
    read to the store's ``bytes_read`` once answered."""

    def __init__(
        self,
        buf: np.ndarray,
        positions: list[int],
        futures: list[Future[None]],
        count: Callable[[str, int], None],
    ) -> None:
        self.buf = buf
        self.positions = positions
        self.futures = futures
        self._count: Callable[[str, int], None] | None = count

    def done(self) -> bool:
        """Whether every request is over (answered, failed or cancelled)."""
        return all(f.done() for f in self.futures)

    def result(self) -> tuple[np.ndarray, list[int]]:
        """The buffer and each range's position in it, every request answered (waits)."""
        wait_all(self.futures)
        if self._count is not None:
            self._count("bytes_read", len(self.buf))
            self._count = None
        return self.buf, self.positions

    def cancel(self) -> None:
        """Cancel the requests not started (a read abandoned: those running finish)."""
        for f in self.futures:
            f.cancel()


def start_remote_into(
    store: ShardStore,
    reqs: list[Request],
    positions: list[int],
    total: int,
    out: np.ndarray | None,
) -> RemoteRead:
    """The bytes of each request, to be read at its position of one uint8 buffer of ``total``
    bytes (the start of ``out`` when it is a large enough uint8 array, else a new array): the
    requests queued on ``store``'s pool now, :meth:`RemoteRead.result` waits for them.
    ``store``: a :class:`~wdsloader.io.fetch.ShardStore` of a remote root (its requests,
    retries, checksum checks and errors are those of
    :meth:`~wdsloader.io.fetch.ShardStore.read_ranges`)."""
    if out is not None and out.dtype == np.uint8 and out.ndim == 1 and out.nbytes >= total:
        buf = out[:total]
    else:
        buf = np.empty(total, dtype=np.uint8)
    sink = buf.data
    remote, segments, pieces = remote_pieces(store, reqs)
    jobs: list[_Job] = []
    for k, s, e in pieces:
        places = []
        for i in segments[k][3]:
            _, a, b = reqs[i]
            lo, hi = max(a, s), min(b, e)
            if lo < hi:
                places.append((positions[i] + lo - a, lo - s, hi - s))
        jobs.append((segments[k][0].path, s, e, places))

    def fetch_into(job: _Job) -> None:
        path, start, stop, places = job
        data = memoryview(remote.fetch_buffer(path, start, stop)).cast("B")
        for at, lo, hi in places:
            sink[at : at + hi - lo] = data[lo:hi]

    return RemoteRead(buf, positions, store._submit_all(fetch_into, jobs), store._count)
