"""Bytes of shards for the loader's workers: indexes, byte ranges, checksums and a local shard cache.

:class:`ShardStore` reads the shard indexes and any ``[start, stop)`` byte ranges of the shards
under a dataset root that is a local folder or any fsspec URL.

- Local roots: each shard is opened once (a small LRU of descriptors) and read with ``os.pread``.
- Remote roots: overlapping or adjacent ranges of a shard are merged, split into requests of at
  most ``max_request_bytes`` and fetched by a thread pool. Transient failures are retried with
  exponential backoff; a retry asks only for the bytes not received yet (HTTP(S) range GETs use
  the filesystem's own aiohttp session, with its headers, auth and client options; other
  filesystems, e.g. s3fs, gcsfs, memory, re-send a failed request of ``fs.cat_file`` whole).
  Connect and read timeouts reach the HTTP and S3 clients, and a deadline bounds each request
  with its retries (see :class:`ReadOptions`; the requests: :mod:`wdsloader.io.retry`; the
  ranges: :mod:`wdsloader.io.ranges`). Messages and logs show URLs and storage errors with
  credentials redacted (:mod:`wdsloader.redact`).
- Cache (``cache_dir``, remote roots only): the first access to a shard downloads it whole into
  a :class:`~wdsloader.io.shard_cache.ShardCache`; later reads are local preads.

A store does no I/O when built and pickles to its root and options (DataLoader workers); the
filesystem, threads and descriptors are opened lazily in each process, and reset after a fork.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import numpy as np
from fsspec.core import split_protocol

from wdsloader.errors import ShardFormatError
from wdsloader.format import ShardInfo, decode_index
from wdsloader.io.options import ReadOptions
from wdsloader.io.ranges import (
    Cut,
    Hole,
    Request,
    merge_requests,
    pread,
    preadv_all,
    split_range,
    unique_shards,
)
from wdsloader.io.retry import RemoteFiles
from wdsloader.io.shard_cache import OpenFiles, ShardCache, hash_fd, pwrite_all
from wdsloader.io.storage import join, url_to_fs
from wdsloader.io.store_checks import StoreChecks
from wdsloader.redact import redact, secrets_of

__all__ = ["STAT_KEYS", "ReadOptions", "Request", "ShardStore"]

logger = logging.getLogger(__name__)

STAT_KEYS = tuple(
    "requests bytes_read bytes_fetched retries cache_hits cache_misses evictions".split()
)
_T = TypeVar("_T")
_R = TypeVar("_R")


class ShardStore(StoreChecks):
    """Reads indexes and byte ranges of the shards under one dataset root (path or fsspec URL).

    Calls on one store are serialized by a lock; the concurrency is inside a call. ``stats``
    counts ``requests`` (storage reads issued, retries included), ``bytes_read`` (returned by
    :meth:`read_ranges`), ``bytes_fetched`` (received from remote storage), ``retries``,
    ``cache_hits``/``cache_misses`` (per shard and call) and ``evictions``.
    """

    def __init__(self, root: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        text = os.fspath(root)
        self.root = text.rstrip("/") or text
        self.options = options if options is not None else ReadOptions()
        self.is_local = split_protocol(self.root)[0] in (None, "file", "local")
        # building the local filesystem does no I/O; it makes a relative root absolute now, so
        # workers started in another directory read the same files
        self._local_base = url_to_fs(self.root)[1] if self.is_local else ""
        self._init_runtime()

    # -- process-local state ---------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._remote: RemoteFiles | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._files = OpenFiles(self.options.max_open_files)
        self._cache: ShardCache | None = None
        if self.options.cache_dir and not self.is_local:
            self._cache = ShardCache(
                str(self.options.cache_dir),
                self.options.cache_limit_bytes,
                files=self._files,
                count=self._count,
                fill=self._download_into,
                check=self._check_download,
            )
        self._indexes: dict[str, np.ndarray] = {}
        self._verified: set[str] = set()
        self._secrets = secrets_of(self.options.storage_options, self.root)
        self._shown_root = redact(self.root, self._secrets)

    def _ensure_process(self) -> None:
        """After a fork, drop the parent's threads, loop-bound sessions and descriptors."""
        if self._pid != os.getpid():
            inherited = self._files
            self._init_runtime()
            inherited.close_all()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("root", "options", "is_local", "_local_base")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"ShardStore({self._shown_root!r}, {self.options!r})"

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close open files and the thread pool; the store reopens them if used again."""
        self._ensure_process()
        with self._lock:
            self._files.close_all()
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            self._remote = None

    @property
    def reads_locally(self) -> bool:
        """True when ranges are read from local files (a local root or the shard cache), where
        a small random read costs little; False when each range is a remote request."""
        return self.is_local or bool(self.options.cache_dir)

    def url(self, shard: ShardInfo) -> str:
        """Full path or URL of a shard, for messages (credentials redacted)."""
        return self._url(shard.path)

    def redact(self, text: object) -> str:
        """``text`` with this store's credentials (URL userinfo, secret storage options, signed
        query strings) replaced by ``***``."""
        return redact(text, self._secrets)

    def _url(self, rel: str) -> str:
        return f"{self._shown_root}/{rel}"

    def _storage(self) -> RemoteFiles:
        """The files under the root, read with this store's retries (opened on first use)."""
        if self._remote is None:
            fs, base = url_to_fs(
                self.root,
                self.options.storage_options,
                connect_timeout=self.options.connect_timeout,
                read_timeout=self.options.read_timeout,
                client_retries=False,  # RemoteFiles retries, under the deadline
            )
            self._remote = RemoteFiles(
                fs, base, self.options, url=self._url, count=self._count, redact=self.redact
            )
        return self._remote

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    # -- index -----------------------------------------------------------------------------------
    def index(self, shard: ShardInfo) -> np.ndarray:
        """Sample start offsets of a shard, then its end offset (int64, read-only, cached)."""
        self._ensure_process()
        with self._lock:
            offsets = self._indexes.get(shard.idx_path)
            if offsets is not None:
                return offsets
            url = self._url(shard.idx_path)
            expected = (shard.num_samples + 1) * 8
            data = self._index_bytes(shard, url)
            if len(data) != expected:
                raise ShardFormatError(
                    f"{url}: index has {len(data)} bytes, expected {expected} "
                    f"({shard.num_samples} samples + 1 end offset)"
                )
            offsets = decode_index(data, source=url)
            if offsets[0] < 0 or offsets[-1] > shard.num_bytes:
                raise ShardFormatError(
                    f"{url}: offsets {offsets[0]}..{offsets[-1]} fall outside the shard's "
                    f"{shard.num_bytes} bytes"
                )
            offsets.flags.writeable = False
            self._indexes[shard.idx_path] = offsets
            return offsets

    def _index_bytes(self, shard: ShardInfo, url: str) -> bytes:
        cache = self._cache
        cpath = cache.path(url, shard) if cache is not None else ""
        try:
            if self.is_local:
                with open(join(self._local_base, shard.idx_path), "rb") as f:
                    return f.read()
            if cache is not None and (data := cache.read(cpath)) is not None:
                return data
            data = self._storage().fetch(shard.idx_path)
        except FileNotFoundError:
            raise ShardFormatError(f"{url}: index file not found") from None
        if cache is not None:
            cache.write(cpath, data)
        return data

    # -- byte ranges -----------------------------------------------------------------------------
    def read_ranges(self, requests: Sequence[Request]) -> list[bytes]:
        """The bytes of each ``(shard, start, stop)`` range, in request order.

        Data missing at the end of a file raises :class:`ShardFormatError` naming the shard and
        the byte offset ("truncated"); a missing shard FileNotFoundError naming it; a read that
        keeps failing :class:`ShardReadError` naming the URL and the byte offset.
        """
        self._ensure_process()
        reqs = [(shard, int(start), int(stop)) for shard, start, stop in requests]
        for shard, start, stop in reqs:
            if start < 0 or stop < start:
                raise ValueError(f"{self.url(shard)}: invalid byte range [{start}, {stop})")
        if not reqs:
            return []
        with self._lock:
            if self.is_local or self._cache is not None:
                out = self._read_files(reqs)
            else:
                out = self._read_remote(reqs)
        self._count("bytes_read", sum(len(b) for b in out))
        return out

    def read_joined(
        self,
        requests: Sequence[Request],
        out: np.ndarray | None = None,
        cuts: Sequence[Sequence[Cut]] | None = None,
    ) -> tuple[bytes | np.ndarray, list[int]]:
        """The ranges of :meth:`read_ranges` back to back in one buffer, and where each starts.

        Local files (and cached copies) are read straight into the buffer (no second copy): the
        start of ``out`` (a uint8 array) when it is large enough, else a new array.

        ``cuts`` (one list per request, each sorted and not overlapping) sends bytes of a range
        elsewhere: for ``(off, buf)``, bytes ``[off, off + len(buf))`` of the range fill
        ``buf``, read from local files straight into it (the returned buffer's bytes there are
        undefined), and copied into it from remote ones.
        """
        reqs = [(shard, int(start), int(stop)) for shard, start, stop in requests]
        positions, total = [], 0
        for shard, start, stop in reqs:
            if start < 0 or stop < start:
                raise ValueError(f"{self.url(shard)}: invalid byte range [{start}, {stop})")
            positions.append(total)
            total += stop - start
        self._ensure_process()
        if cuts is not None and len(cuts) != len(reqs):
            raise ValueError(f"{len(cuts)} lists of cuts for {len(reqs)} requests")
        if not (self.is_local or self._cache is not None):
            parts = self.read_ranges(reqs)
            joined = parts[0] if len(parts) == 1 else b"".join(parts)
            if cuts is not None:
                _copy_cuts(memoryview(joined), positions, cuts)
            return joined, positions
        if out is not None and out.dtype == np.uint8 and out.ndim == 1 and len(out) >= total:
            buf = out[:total]
        else:
            buf = np.empty(total, dtype=np.uint8)  # not zero-filled: every byte is read into
        with self._lock:
            self._read_files(reqs, memoryview(buf), positions, cuts)  # type: ignore[arg-type]
        self._count("bytes_read", total)
        return buf, positions

    def _read_remote(self, reqs: list[Request]) -> list[bytes]:
        remote = self._storage()
        if self.options.verify_checksum:
            for rel, shard in unique_shards(reqs).items():
                if rel not in self._verified:
                    self._check_digest(shard, self._hash_remote(shard))
                    self._verified.add(rel)
        segments = merge_requests(reqs)
        step = self.options.max_request_bytes
        pieces = [
            (k, s, min(s + step, stop))
            for k, (_, start, stop, _) in enumerate(segments)
            for s in range(start, stop, step)
        ]
        results = self._run_all(lambda p: remote.fetch(segments[p[0]][0].path, p[1], p[2]), pieces)
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

    def _read_files(
        self,
        reqs: list[Request],
        sink: memoryview | None = None,
        positions: Sequence[int] = (),
        cuts: Sequence[Sequence[Cut]] | None = None,
    ) -> list[bytes]:
        """Preads from local files: the shards of a local root, or their cached copies (into
        ``sink`` at ``positions`` when given, but for the ``cuts`` of each request (see
        :meth:`read_joined`); then nothing is returned)."""
        shards = unique_shards(reqs)
        if self._cache is None:  # a local root
            paths = {rel: join(self._local_base, rel) for rel in shards}
        else:
            paths = {rel: self._cache.path(self._url(rel), s) for rel, s in shards.items()}
            self._cache.ensure(list(shards.values()), paths, set(paths.values()))
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

    def _fd(self, shard: ShardInfo, path: str, pinned: set[str]) -> int:
        """An open descriptor on the local file of a shard (opened, or downloaded, if needed)."""
        fd = self._files.get(path)
        if fd is not None:
            return fd
        if self._cache is None:  # a local root
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                url = self.url(shard)
                raise FileNotFoundError(errno.ENOENT, "shard file not found", url) from None
            self._files.put(path, fd)
            return fd
        self._cache.ensure([shard], {shard.path: path}, pinned)  # holds the descriptor
        return self._files[path]

    def _pread(self, fd: int, start: int, stop: int, url: str) -> bytes:
        self._count("requests")
        return pread(fd, start, stop, url)

    def _download_into(self, files: list[tuple[ShardInfo, int]]) -> None:
        """Write the whole of each shard into its descriptor, in parallel ranges."""
        remote = self._storage()
        step = self.options.max_request_bytes
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

    # -- remote requests -------------------------------------------------------------------------
    def _run_all(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(x) for x in items]`` on the thread pool; raises the first error once none runs."""
        if len(items) <= 1 or self.options.concurrency == 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.options.concurrency, "wdsloader-fetch")
        futures = [self._pool.submit(fn, x) for x in items]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        wait(pending)
        return [f.result() for f in futures]


def _copy_cuts(joined: memoryview, positions: Sequence[int], cuts: Sequence[Sequence[Cut]]) -> None:
    """Fill each cut's buffer (not a hole's) from the joined ranges (remote reads: one more
    copy)."""
    for pos, todo in zip(positions, cuts, strict=True):
        for off, buf in todo:
            if not isinstance(buf, Hole):
                buf[:] = joined[pos + off : pos + off + len(buf)]
