"""The store of a remote root read by ranged requests (any fsspec URL, no cache)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from wdsloader.format import ShardInfo
from wdsloader.io.fetch import ShardStore
from wdsloader.io.ranges import Cut, Hole, Request
from wdsloader.io.remote_into import RemoteRead, remote_pieces, start_remote_into
from wdsloader.io.retry import RemoteFiles

__all__ = ["RemoteStore", "copy_cuts", "fetch_side_file", "read_remote_ranges"]


def fetch_side_file(remote: RemoteFiles, rel: str, size: int | None) -> bytes:
    """A small file under the root read whole with ``remote``'s retries and deadline: with a
    known ``size``, its first ``size + 1`` bytes in one ranged request (see
    :meth:`~wdsloader.io.store.Store.read_side_file`)."""
    return remote.fetch(rel) if size is None else remote.fetch_upto(rel, size + 1)


class RemoteStore(ShardStore):
    """Reads ranges of remote shards: overlapping or adjacent ranges of a shard merged, split
    into requests of at most ``max_request_bytes``, fetched ``concurrency`` at a time with the
    retries and deadline of :class:`~wdsloader.io.retry.RemoteFiles`. The store's lock is
    never held while it waits for its requests: the requests of reads started meanwhile
    (:meth:`start_joined`) queue behind them on its one pool."""

    _READ_LOCKED: ClassVar[bool] = False

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """A small file beside ``shard`` (see :meth:`wdsloader.io.store.Store.read_side_file`),
        with the retries and deadline of the shards' reads."""
        self._ensure_process()
        with self._lock:
            remote = self._storage()
        return fetch_side_file(remote, rel, size)

    def start_joined(
        self, requests: Sequence[Request], out: np.ndarray | None = None
    ) -> RemoteRead:
        """:meth:`~wdsloader.io.fetch.ShardStore.read_joined` (no cuts) started, not waited for:
        its requests queued now on the store's pool, behind those of the reads started before
        (so they go first); :meth:`RemoteRead.result` is ``(buffer, positions)`` once they are
        answered, or raises what ``read_joined`` raises."""
        reqs, positions, total = self._checked(requests)
        self._ensure_process()
        return start_remote_into(self, reqs, positions, total, out)

    def _read(self, reqs: list[Request]) -> list[bytes]:
        return read_remote_ranges(self, reqs)

    def _read_joined(
        self,
        reqs: list[Request],
        positions: list[int],
        total: int,
        out: np.ndarray | None,
        cuts: Sequence[Sequence[Cut]] | None,
    ) -> bytes | np.ndarray:
        joined, _ = start_remote_into(self, reqs, positions, total, out).result()
        if cuts is not None:
            copy_cuts(joined.data, positions, cuts)
        return joined


def read_remote_ranges(store: ShardStore, reqs: list[Request]) -> list[bytes]:
    """The bytes of each request, read from ``store``'s remote root by ranged requests:
    overlapping or adjacent ranges of a shard merged, split into requests of the store's tuned
    size, fetched with its concurrency, retries and deadline; each shard's sha256 checked first
    (once per store) when ``verify_checksum`` is set. What :class:`RemoteStore` reads, and what
    :class:`~wdsloader.io.file_store.CachedStore` reads of shards its cache has no room for."""
    remote, segments, pieces = remote_pieces(store, reqs)
    results = store._run_all(lambda p: remote.fetch(segments[p[0]][0].path, p[1], p[2]), pieces)
    chunks: list[list[bytes]] = [[] for _ in segments]
    for (k, _, _), data in zip(pieces, results, strict=True):
        chunks[k].append(data)
    out: list[bytes] = [b""] * len(reqs)
    for (_, seg_start, seg_stop, members), parts in zip(segments, chunks, strict=True):
        buf = b"".join(parts)
        view = memoryview(buf)
        for i in members:
            _, start, stop = reqs[i]
            whole = start == seg_start and stop == seg_stop
            out[i] = buf if whole else bytes(view[start - seg_start : stop - seg_start])
    return out


def copy_cuts(joined: memoryview, positions: Sequence[int], cuts: Sequence[Sequence[Cut]]) -> None:
    """Fills each cut's buffer (a hole's is left alone) from the joined ranges: the cuts of
    request ``i`` are offsets from ``positions[i]``, where its bytes start in ``joined`` (ranges
    read remotely cost this one more copy)."""
    for pos, todo in zip(positions, cuts, strict=True):
        for off, buf in todo:
            if not isinstance(buf, Hole):
                buf[:] = joined[pos + off : pos + off + len(buf)]
