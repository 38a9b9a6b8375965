"""Stores that read local files with ``pread``: the shards of a local root (:class:`LocalStore`),
or whole copies of remote shards in a shard cache (:class:`CachedStore`)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from wdsloader.format import ShardInfo
from wdsloader.io.cache_ledger import (
    Ledger,
    evicted,
    forget_evictions,
    readers,
    space_lock,
    streamed,
)
from wdsloader.io.fetch import ShardStore
from wdsloader.io.options import ReadOptions
from wdsloader.io.ranges import (
    Cut,
    Job,
    Request,
    halve_jobs,
    pread,
    preadv_all,
    split_range,
    unique_shards,
)
from wdsloader.io.remote_store import copy_cuts, fetch_side_file, read_remote_ranges
from wdsloader.io.shard_cache import ShardCache, hash_fd, pwrite_all
from wdsloader.io.storage import join, url_to_fs

__all__ = ["CachedStore", "FileStore", "LocalStore"]

SPLIT_BYTES = 8 << 20  # a joined read of this many bytes or more runs on two threads


def _run_jobs(jobs: list[Job], url: Callable[[str], str]) -> None:
    for fd, pieces, start, name in jobs:
        preadv_all(fd, pieces, start, name, url)


class FileStore(ShardStore):
    """A store whose ranges are preads of local files (the implementations say which files)."""

    @property
    def reads_locally(self) -> bool:
        """True: ranges are read from local files."""
        return True

    def _paths(self, shards: dict[str, ShardInfo]) -> dict[str, str]:
        """The local file of each shard (by shard path), ready to be opened."""
        raise NotImplementedError

    def _read(self, reqs: list[Request]) -> list[bytes]:
        return self._read_files(reqs)

    def _read_joined(
        self,
        reqs: list[Request],
        positions: list[int],
        total: int,
        out: np.ndarray | None,
        cuts: Sequence[Sequence[Cut]] | None,
    ) -> bytes | np.ndarray:
        if out is not None and out.dtype == np.uint8 and out.ndim == 1 and len(out) >= total:
            buf = out[:total]
        else:
            buf = np.empty(total, dtype=np.uint8)  # not zero-filled: every byte is read into
        with self._lock:
            self._read_files(reqs, memoryview(buf), positions, cuts)  # type: ignore[arg-type]
        self._count("bytes_read", total)
        return buf

    def _read_files(
        self,
        reqs: list[Request],
        sink: memoryview | None = None,
        positions: Sequence[int] = (),
        cuts: Sequence[Sequence[Cut]] | None = None,
    ) -> list[bytes]:
        """Preads from the local files (into ``sink`` at ``positions`` when given, but for the
        ``cuts`` of each request (see :meth:`read_joined`); then nothing is returned)."""
        shards = unique_shards(reqs)
        paths = self._paths(shards)
        for rel, shard in shards.items():
            self._verify_once(shard, paths[rel])
        pinned = set(paths.values())
        if sink is not None:
            jobs: list[Job] = []
            last, fd = None, -1
            self._count("requests", len(reqs))  # once: a lock per sample cost ~10% of a read
            self._files.pinned = pinned  # the descriptors collected stay open until read
            try:
                for i, ((shard, start, stop), pos) in enumerate(zip(reqs, positions, strict=True)):
                    if shard is not last:  # requests of a shard come one after the other
                        last, fd = shard, self._fd(shard, paths[shard.path], pinned)
                    into = sink[pos : pos + stop - start]
                    pieces = [into] if cuts is None or not cuts[i] else split_range(into, cuts[i])
                    jobs.append((fd, pieces, start, shard.path))
                self._preadv_jobs(jobs, len(sink))
            finally:
                self._files.pinned = ()
                self._files.trim()
            return []
        return [
            self._pread(self._fd(shard, paths[shard.path], pinned), start, stop, self.url(shard))
            for shard, start, stop in reqs
        ]

    def _preadv_jobs(self, jobs: list[Job], nbytes: int) -> None:
        """Run the preads ``jobs`` (under the lock); a read of :data:`SPLIT_BYTES` or more is
        cut in two halves of equal bytes (:func:`halve_jobs`), the first read on a thread of the
        store's pool (idle: its remote requests run under the lock too; the copies release the
        GIL), the second on this one. Returns (or raises the first half's error first) only
        once both are over: the descriptors stay pinned and no thread writes into the sink
        after the call."""
        if nbytes < SPLIT_BYTES:
            _run_jobs(jobs, self._url)
            return
        head, tail = halve_jobs(jobs)
        first = self._thread_pool().submit(_run_jobs, head, self._url)
        late: BaseException | None = None
        try:
            _run_jobs(tail, self._url)
        except BaseException as exc:  # noqa: BLE001 - raised below, once the first half is over
            late = exc
        early = first.exception()  # waits for the first half
        if early is not None:
            raise early
        if late is not None:
            raise late

    def _pread(self, fd: int, start: int, stop: int, url: str) -> bytes:
        self._count("requests")
        return pread(fd, start, stop, url)


class LocalStore(FileStore):
    """The shards of a local folder (a path or ``file://`` URL)."""

    is_local: ClassVar[bool] = True
    _PICKLED: ClassVar[tuple[str, ...]] = (*FileStore._PICKLED, "_local_base")
    _SHIPS_INDEXES = False  # each worker reads the local index files it uses

    def __init__(self, root: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        super().__init__(root, options)
        # building the local filesystem does no I/O; it makes a relative root absolute now, so
        # workers started in another directory read the same files
        self._local_base = url_to_fs(self.root)[1]

    def _index_bytes(self, shard: ShardInfo, expected: int) -> bytes:
        with open(join(self._local_base, shard.idx_path), "rb") as f:
            return f.read()

    def _paths(self, shards: dict[str, ShardInfo]) -> dict[str, str]:
        return {rel: join(self._local_base, rel) for rel in shards}

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """A small file beside ``shard`` (see :meth:`wdsloader.io.store.Store.read_side_file`):
        a local read."""
        with open(join(self._local_base, rel), "rb") as f:
            return f.read() if size is None else f.read(size + 1)

    def _fd(self, shard: ShardInfo, path: str, pinned: set[str]) -> int:
        """An open descriptor on the shard's file."""
        fd = self._files.get(path)
        if fd is not None:
            return fd
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            url = self.url(shard)
            raise FileNotFoundError(errno.ENOENT, "shard file not found", url) from None
        self._files.put(path, fd)
        return fd

    def _own_file(self, shard: ShardInfo) -> str | None:
        return join(self._local_base, shard.path)

    def _local_copy(self, shard: ShardInfo) -> str | None:
        return join(self._local_base, shard.path)


class _NoRoom(Exception):
    """The cache limit leaves no room for a read's shards (all the rest is being read)."""


class CachedStore(FileStore):
    """The shards of a remote root, each downloaded whole into ``options.cache_dir`` on first
    use (a :class:`~wdsloader.io.shard_cache.ShardCache`), then read locally.

    With ``cache_limit_bytes``, a reader that announces its pass (:meth:`expect_reads`,
    :meth:`reads_done`) lets the cache evict what no reader of the node still needs first; a
    read whose shards find no room is served by ranged requests instead, not cached."""

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._cache = ShardCache(
            str(self.options.cache_dir),
            self.options.cache_limit_bytes,
            files=self._files,
            count=self._count,
            fill=self._download_into,
            check=self._check_download,
        )
        self._ledger: Ledger | None = None
        self._ready: dict[str, str] | None = None  # cached paths of the call under way
        self._streamed: set[str] = set()  # shards this pass reads remotely (no room)

    @property
    def plans_eviction(self) -> bool:
        """True when the cache is bounded: readers then announce their passes."""
        return self.options.cache_limit_bytes is not None

    def expect_reads(
        self, uses: Sequence[tuple[ShardInfo, int, int]], epoch: int | None = None
    ) -> None:
        """A new pass of this process reads each ``(shard, first, last)`` at positions (e.g.
        batches) ``first`` to ``last``; see :meth:`reads_done`. With its ``epoch``, a shard
        that the node evicted during that epoch before this pass began is read by ranges, not
        downloaded a second time."""
        self._ensure_process()
        cache, self._streamed = self._cache, set()
        cache.epoch = epoch
        claims = {
            os.path.basename(cache.path(self._url(s.path), s)): (first, last)
            for s, first, last in uses
        }
        if self._ledger is None:
            with space_lock(cache.cache_dir):  # no process's scan sees it half made
                if not readers(cache.cache_dir):  # the first reader: earlier evictions are over
                    forget_evictions(cache.cache_dir)
                self._ledger = Ledger(cache.cache_dir)
                self._ledger.expect(claims)
        else:
            self._ledger.expect(claims)

    def reads_done(self, position: int) -> None:
        """The pass announced by :meth:`expect_reads` has read every position before
        ``position``: the shards it no longer reads may be evicted first."""
        if self._ledger is not None and self._pid == os.getpid():
            self._ledger.done(position)

    def close(self) -> None:
        """Close open files, the thread pool, and release this process's claims."""
        super().close()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def _index_bytes(self, shard: ShardInfo, expected: int) -> bytes:
        cpath = self._cache.path(self._url(shard.idx_path), shard)
        if (data := self._cache.read(cpath)) is not None:
            return data
        data = super()._index_bytes(shard, expected)
        self._cache.write(cpath, data)
        return data

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """A small file beside ``shard`` (see :meth:`wdsloader.io.store.Store.read_side_file`):
        from the cache, else downloaded with the retries and deadline of the shards' reads and
        kept in the cache."""
        self._ensure_process()
        with self._lock:
            cpath = self._cache.path(self._url(rel), shard)
            if (data := self._cache.read(cpath)) is not None:
                return data
            data = fetch_side_file(self._storage(), rel, size)
            self._cache.write(cpath, data)
            return data

    def _paths(self, shards: dict[str, ShardInfo]) -> dict[str, str]:
        ready = self._ready
        if ready is not None and shards.keys() <= ready.keys():
            return {rel: ready[rel] for rel in shards}
        paths = self._placed(shards)
        if len(paths) < len(shards):
            raise _NoRoom
        return paths

    def _placed(self, shards: dict[str, ShardInfo]) -> dict[str, str]:
        """The cache paths of those of ``shards`` now cached (downloaded if there is room;
        those that find none are left out). ValueError for a shard larger than the limit."""
        limit = self.options.cache_limit_bytes
        for shard in shards.values():
            if limit is not None and shard.num_bytes > limit:
                raise ValueError(
                    f"{self.url(shard)}: shard of {shard.num_bytes} bytes does not fit "
                    f"cache_limit_bytes={limit}; raise the limit to at least the largest shard, "
                    "or read without cache_dir (ranged requests)"
                )
        cache = self._cache
        paths = {rel: cache.path(self._url(rel), s) for rel, s in shards.items()}
        # a shard this pass (or another reader's on the node) began to read remotely, or that
        # the node evicted this epoch, stays remote unless cached: no byte fetched twice
        missing = [rel for rel, s in shards.items() if not cache.lookup(paths[rel], s.num_bytes)]
        if missing and self._ledger is not None:
            node = streamed(cache.cache_dir)
            if cache.epoch is not None:  # downloaded and evicted this epoch: not twice
                node |= evicted(cache.cache_dir, cache.epoch)
            self._streamed.update(r for r in missing if os.path.basename(paths[r]) in node)
        todo = {r: s for r, s in shards.items() if r not in missing or r not in self._streamed}
        if cache.ensure(list(todo.values()), {r: paths[r] for r in todo}, set(paths.values())):
            placed = {rel: paths[rel] for rel in todo}
        else:  # no room for all: as many as fit, one at a time
            placed = {}
            for rel, shard in todo.items():
                if cache.ensure([shard], {rel: paths[rel]}, {*placed.values(), paths[rel]}):
                    placed[rel] = paths[rel]
        left = {rel for rel in shards if rel not in placed}
        self._streamed |= left
        if left and self._ledger is not None:
            self._ledger.stream({os.path.basename(paths[rel]) for rel in left})
        return placed

    def _split(self, reqs: list[Request]) -> tuple[list[int], list[int]]:
        """The requests whose shards are cached (read locally) and the others (read remotely:
        no room in the cache for them); the cached paths are kept for this call."""
        self._ready = paths = self._placed(unique_shards(reqs))
        local = [i for i, (shard, _, _) in enumerate(reqs) if shard.path in paths]
        return local, [i for i, (shard, _, _) in enumerate(reqs) if shard.path not in paths]

    def _read(self, reqs: list[Request]) -> list[bytes]:
        try:
            local, remote = self._split(reqs)
            if not remote:
                return super()._read(reqs)
            out: list[bytes] = [b""] * len(reqs)
            for part, read in ((local, super()._read), (remote, self._read_remote)):
                for i, data in zip(
                    part, read([reqs[i] for i in part]) if part else [], strict=True
                ):
                    out[i] = data
            return out
        finally:
            self._ready = None

    def _read_remote(self, reqs: list[Request]) -> list[bytes]:
        return read_remote_ranges(self, reqs)

    def _read_joined(
        self,
        reqs: list[Request],
        positions: list[int],
        total: int,
        out: np.ndarray | None,
        cuts: Sequence[Sequence[Cut]] | None,
    ) -> bytes | np.ndarray:
        with self._lock:
            try:
                local, remote = self._split(reqs)
                if not remote:
                    return super()._read_joined(reqs, positions, total, out, cuts)
                return self._read_mixed(reqs, positions, total, out, cuts, local, remote)
            finally:
                self._ready = None

    def _read_mixed(
        self,
        reqs: list[Request],
        positions: list[int],
        total: int,
        out: np.ndarray | None,
        cuts: Sequence[Sequence[Cut]] | None,
        local: list[int],
        remote: list[int],
    ) -> np.ndarray:
        """:meth:`_read_joined` of requests ``local`` read from cached copies and ``remote``
        ones read by ranged requests."""
        if out is not None and out.dtype == np.uint8 and out.ndim == 1 and len(out) >= total:
            buf = out[:total]
        else:
            buf = np.empty(total, dtype=np.uint8)
        view = memoryview(buf)  # type: ignore[arg-type]
        if local:
            sub = None if cuts is None else [cuts[i] for i in local]
            self._read_files([reqs[i] for i in local], view, [positions[i] for i in local], sub)
        for i, data in zip(remote, self._read_remote([reqs[i] for i in remote]), strict=True):
            view[positions[i] : positions[i] + len(data)] = data
            if cuts is not None:
                copy_cuts(view, [positions[i]], [cuts[i]])
        self._count("bytes_read", total)
        return buf

    def _fd(self, shard: ShardInfo, path: str, pinned: set[str]) -> int:
        """An open descriptor on the cached copy of the shard (downloaded if needed)."""
        fd = self._files.get(path)
        if fd is not None:
            return fd
        self._cache.ensure([shard], {shard.path: path}, pinned)  # holds the descriptor
        return self._files[path]

    def _local_copy(self, shard: ShardInfo) -> str | None:
        path = self._cache.path(self.url(shard), shard)
        self._cache.ensure([shard], {shard.path: path}, {path})
        return path

    def _discard(self, path: str) -> None:
        self._cache.discard(path)

    def _download_into(self, files: list[tuple[ShardInfo, int]]) -> None:
        """Write the whole of each shard into its descriptor, in parallel ranges."""
        remote = self._storage(data=True)
        step = self.tuning().request_bytes
        jobs = [
            (fd, shard.path, s, min(s + step, shard.num_bytes))
            for shard, fd in files
            for s in range(0, shard.num_bytes, step)
        ]
        self._run_all(lambda j: pwrite_all(j[0], remote.fetch(*j[1:]), j[2]), jobs)

    def _check_download(self, shard: ShardInfo, cpath: str, fd: int) -> None:
        """Check a shard downloaded into the cache, if checksums are verified."""
        if self.options.verify_checksum and shard.sha256:
            self._check_digest(shard, hash_fd(fd))
            self._verified.add(cpath)
