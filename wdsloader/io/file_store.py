"""Stores that read local files with ``pread``: the shards of a local root (:class:`LocalStore`),
or whole copies of remote shards in a shard cache (:class:`CachedStore`)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from wdsloader.format import ShardInfo
from wdsloader.io.fetch import ShardStore
from wdsloader.io.options import ReadOptions
from wdsloader.io.ranges import Cut, Request, pread, preadv_all, split_range, unique_shards
from wdsloader.io.shard_cache import ShardCache, hash_fd, pwrite_all
from wdsloader.io.storage import join, url_to_fs

__all__ = ["CachedStore", "FileStore", "LocalStore"]


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
            last, fd = None, -1
            for i, ((shard, start, stop), pos) in enumerate(zip(reqs, positions, strict=True)):
                if shard is not last:  # requests of a shard come one after the other
                    last, fd = shard, self._fd(shard, paths[shard.path], pinned)
                self._count("requests")
                into = sink[pos : pos + stop - start]
                pieces = [into] if cuts is None or not cuts[i] else split_range(into, cuts[i])
                preadv_all(fd, pieces, start, shard.path, self._url)
            return []
        return [
            self._pread(self._fd(shard, paths[shard.path], pinned), start, stop, self.url(shard))
            for shard, start, stop in reqs
        ]

    def _pread(self, fd: int, start: int, stop: int, url: str) -> bytes:
        self._count("requests")
        return pread(fd, start, stop, url)


class LocalStore(FileStore):
    """The shards of a local folder (a path or ``file://`` URL)."""

    is_local: ClassVar[bool] = True
    _PICKLED = ("root", "options", "_shipped", "_measured", "_local_base")
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


class CachedStore(FileStore):
    """The shards of a remote root, each downloaded whole into ``options.cache_dir`` on first
    use (a :class:`~wdsloader.io.shard_cache.ShardCache`), then read locally."""

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

    def _index_bytes(self, shard: ShardInfo, expected: int) -> bytes:
        cpath = self._cache.path(self._url(shard.idx_path), shard)
        if (data := self._cache.read(cpath)) is not None:
            return data
        data = super()._index_bytes(shard, expected)
        self._cache.write(cpath, data)
        return data

    def _paths(self, shards: dict[str, ShardInfo]) -> dict[str, str]:
        paths = {rel: self._cache.path(self._url(rel), s) for rel, s in shards.items()}
        self._cache.ensure(list(shards.values()), paths, set(paths.values()))
        return paths

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
        remote = self._storage()
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
