"""Remote byte ranges read back to back into one buffer, each answer copied in as it arrives.

:func:`read_remote_into` is what :meth:`RemoteStore.read_joined
<wdsloader.io.fetch.ShardStore.read_joined>` reads with: the ranges merged and split into
requests as :func:`~wdsloader.io.remote_store.read_remote_ranges` does, but each request's
bytes are copied straight to their places in the buffer by the thread that fetched them, while
the other requests are still in flight. A window's bytes are copied once, not joined per span
and then again for the window after the last answer (the link idle meanwhile), and each answer
is dropped once copied, so the buffer and the requests in flight are all a read holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from wdsloader.io.ranges import Request, merge_requests, unique_shards

if TYPE_CHECKING:
    from wdsloader.io.fetch import ShardStore

__all__ = ["read_remote_into", "verify_checksums"]


def verify_checksums(store: ShardStore, reqs: list[Request]) -> None:
    """Each shard of ``reqs`` not checked yet by ``store``: its sha256 checked, when the
    store's options ask for it (``verify_checksum``)."""
    if store.options.verify_checksum:
        for rel, shard in unique_shards(reqs).items():
            if rel not in store._verified:
                store._check_digest(shard, store._hash_remote(shard))
                store._verified.add(rel)


def read_remote_into(
    store: ShardStore,
    reqs: list[Request],
    positions: Sequence[int],
    total: int,
    out: np.ndarray | None,
) -> np.ndarray:
    """The bytes of each request at its position of one uint8 buffer of ``total`` bytes: the
    start of ``out`` when it is a large enough uint8 array, else a new array. ``store``: a
    :class:`~wdsloader.io.fetch.ShardStore` of a remote root (its requests, retries, checksum
    checks and errors are those of :meth:`~wdsloader.io.fetch.ShardStore.read_ranges`)."""
    if out is not None and out.dtype == np.uint8 and out.ndim == 1 and out.nbytes >= total:
        buf = out[:total]
    else:
        buf = np.empty(total, dtype=np.uint8)
    sink = buf.data
    remote = store._storage(data=True)
    verify_checksums(store, reqs)
    segments = merge_requests(reqs)
    step = store.tuning().request_bytes
    # each request: (path, start, stop, [(where in buf, from, to) of the bytes it answers])
    jobs: list[tuple[str, int, int, list[tuple[int, int, int]]]] = []
    for shard, seg_start, seg_stop, members in segments:
        for s in range(seg_start, seg_stop, step):
            e = min(s + step, seg_stop)
            places = []
            for i in members:
                _, a, b = reqs[i]
                lo, hi = max(a, s), min(b, e)
                if lo < hi:
                    places.append((positions[i] + lo - a, lo - s, hi - s))
            jobs.append((shard.path, s, e, places))

    def fetch_into(job: tuple[str, int, int, list[tuple[int, int, int]]]) -> None:
        path, start, stop, places = job
        data = memoryview(remote.fetch(path, start, stop)).cast("B")
        for at, lo, hi in places:
            sink[at : at + hi - lo] = data[lo:hi]

    store._run_all(fetch_into, jobs)
    return buf
