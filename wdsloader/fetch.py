"""Bytes of shards for the loader's workers: indexes, byte ranges, retries and a local shard cache.

:class:`ShardStore` reads the ``.tar.idx`` of a shard and any ``[start, stop)`` byte ranges of it,
for a dataset root that is a local folder or any fsspec URL.

- Local roots: each shard is opened once (a small LRU of file descriptors) and read with
  ``os.pread``; no fsspec call per read.
- Remote roots: adjacent ranges of a shard are coalesced, split into requests of at most
  ``max_request_bytes`` and fetched concurrently by a thread pool. Transient failures are retried
  with exponential backoff, and a retry asks only for the bytes not received yet.
- HTTP(S): ``HTTPFileSystem.cat_file`` reads a whole response body at once, so a connection dropped
  mid-body loses everything that arrived. Range GETs therefore go through the filesystem's own
  aiohttp session and event loop (its headers, auth and client options apply) and append each
  chunk to the piece's buffer as it arrives; after a drop the retry asks for ``Range: bytes=N-``
  where N is the first byte not received.
- Other remote filesystems (S3 through s3fs, GCS, memory) use ``fs.cat_file(path, start=, end=)``
  per request: a failed request is re-sent whole, but never more than ``max_request_bytes``.
- Optional cache (``cache_dir``): the first access to a remote shard downloads it whole (in
  parallel ranges, into a temporary file renamed into place), later reads are local preads. Cached
  files are named by a hash of the full URL (plus size and checksum), so equal basenames from
  different roots never collide, and evicted least-recently-used beyond ``cache_limit_bytes``.
  Several processes may share a folder: files appear only complete (``os.replace``), and a file
  another process evicted is downloaded again.

A store does no I/O when built and pickles to its root and options, so it can be sent to DataLoader
worker processes; filesystems, threads and file descriptors are opened lazily in each process.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import posixpath
import re
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from wdsloader.errors import ShardFormatError, WdsLoaderError
from wdsloader.format import ShardInfo, decode_index
from wdsloader.storage import join, url_to_fs

logger = logging.getLogger(__name__)

STAT_KEYS = (
    "requests",
    "bytes_read",
    "bytes_fetched",
    "retries",
    "cache_hits",
    "cache_misses",
    "evictions",
)
MAX_BACKOFF_S = 2.0
_STREAM_CHUNK = 1 << 18
_HASH_CHUNK = 8 << 20
_CACHE_NAME = re.compile(r"^wds-[0-9a-f]{24}-")
_TMP_PREFIX = ".wds-tmp-"
_STALE_TMP_S = 3600.0
_T = TypeVar("_T")
_R = TypeVar("_R")


class ShardReadError(WdsLoaderError, OSError):
    """Reading a shard failed for good: retries exhausted or a non-transient storage error."""


class _RangeNotSatisfiable(Exception):
    """The server has no byte at the requested offset (HTTP 416)."""


class _HTTPStatusError(OSError):
    """An HTTP status other than success; ``status`` decides whether it is retried."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


@dataclass(slots=True, kw_only=True)
class ReadOptions:
    """How a :class:`ShardStore` reads.

    ``retries`` counts retries per request on transient errors (dropped or reset connections,
    timeouts, HTTP 5xx/408/429, aiohttp payload errors, other ``OSError``); missing files, denied
    access and other client errors are not retried. ``backoff`` is the first delay in seconds,
    doubled each retry, capped at 2 s. ``concurrency`` threads serve remote requests.
    ``cache_dir`` keeps whole remote shards (and their indexes) locally, ``cache_limit_bytes``
    caps its size (least recently used files go first). ``verify_checksum`` checks a shard's
    sha256 from the manifest when it is first downloaded into the cache or first opened.
    """

    storage_options: dict[str, Any] | None = None
    retries: int = 5
    backoff: float = 0.05
    max_request_bytes: int = 8 * 2**20
    concurrency: int = 8
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    verify_checksum: bool = False
    max_open_files: int = 64

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0:
            raise ValueError("retries and backoff must be >= 0")
        if self.max_request_bytes < 1 or self.concurrency < 1 or self.max_open_files < 1:
            raise ValueError("max_request_bytes, concurrency and max_open_files must be >= 1")
        if self.cache_limit_bytes is not None and self.cache_limit_bytes < 0:
            raise ValueError("cache_limit_bytes must be >= 0")


class ShardStore:
    """Reads indexes and byte ranges of the shards under one dataset root (path or fsspec URL).

    Calls on one store are serialized by a lock; the concurrency is inside a call. ``stats``
    counts ``requests`` (storage reads issued, retries included), ``bytes_read`` (returned by
    :meth:`read_ranges`), ``bytes_fetched`` (received from remote storage), ``retries``,
    ``cache_hits``/``cache_misses`` (per shard and call) and ``evictions``.
    """

    def __init__(self, root: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        import fsspec.core

        text = os.fspath(root)
        self.root = text.rstrip("/") or text
        self.options = options if options is not None else ReadOptions()
        self.is_local = fsspec.core.split_protocol(self.root)[0] in (None, "file", "local")
        # The local filesystem does no I/O when built; it makes a relative root absolute now,
        # so workers started in another directory read the same files.
        self._local_base = url_to_fs(self.root)[1] if self.is_local else None
        self._init_runtime()

    # -- process-local state ---------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._fs: Any = None
        self._base = ""
        self._http = False
        self._pool: ThreadPoolExecutor | None = None
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._indexes: dict[str, np.ndarray] = {}
        self._verified: set[str] = set()

    def _ensure_process(self) -> None:
        """Drop state inherited through ``fork`` (threads, loop-bound sessions) in a new process."""
        if False:
            inherited = list(self._fds.values())
            self._init_runtime()
            for fd in inherited:
                _close_quietly(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "options": self.options,
            "is_local": self.is_local,
            "local_base": self._local_base,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root = state["root"]
        self.options = state["options"]
        self.is_local = state["is_local"]
        self._local_base = state["local_base"]
        self._init_runtime()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close open files and the thread pool; the store reopens them if used again."""
        with self._lock:
            if self._pid != os.getpid():
                self._ensure_process()
                return
            while self._fds:
                _close_quietly(self._fds.popitem()[1])
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            self._fs = None

    # -- names -----------------------------------------------------------------------------------
    def url(self, shard: ShardInfo) -> str:
        """Full path or URL of a shard, for messages."""
        return self._url(shard.path)

    def _url(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _filesystem(self) -> Any:
        if self._fs is None:
            self._fs, self._base = url_to_fs(self.root, self.options.storage_options)
            self._http = _is_http(self._fs)
        return self._fs

    def _local_path(self, rel: str) -> str:
        assert self._local_base is not None
        return join(self._local_base, rel)

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    # -- index -----------------------------------------------------------------------------------
    def index(self, shard: ShardInfo) -> np.ndarray:
        """Sample start offsets of a shard plus its end offset (int64, read-only, cached)."""
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
        if self.is_local:
            try:
                with open(self._local_path(shard.idx_path), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                raise ShardFormatError(f"{url}: index file not found") from None
        cpath = self._cache_file(url, shard) if self.options.cache_dir else None
        if cpath is not None:
            try:
                with open(cpath, "rb") as f:
                    data = f.read()
                os.utime(cpath)
                return data
            except FileNotFoundError:
                pass
        fs = self._filesystem()
        try:
            data = self._fetch_whole(fs, join(self._base, shard.idx_path), url)
        except FileNotFoundError:
            raise ShardFormatError(f"{url}: index file not found") from None
        if cpath is not None:
            self._make_room(len(data), set())
            fd, tmp = self._temp_file()
            try:
                _pwrite_all(fd, data, 0)
                os.replace(tmp, cpath)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            finally:
                os.close(fd)
        return data

    # -- byte ranges -----------------------------------------------------------------------------
    def read_ranges(self, requests: Sequence[tuple[ShardInfo, int, int]]) -> list[bytes]:
        """The bytes of each ``(shard, start, stop)`` range, in request order.

        A range past the end of the file raises :class:`ShardFormatError` naming the shard and
        the byte offset where the data stops ("truncated"); a missing shard FileNotFoundError
        naming it; a read that keeps failing :class:`ShardReadError` naming URL and offset.
        """
        self._ensure_process()
        reqs = [(shard, int(start), int(stop)) for shard, start, stop in requests]
        for shard, start, stop in reqs:
            if start < 0 or stop < start:
                raise ValueError(f"{self.url(shard)}: invalid byte range [{start}, {stop})")
        if not reqs:
            return []
        with self._lock:
            if self.is_local:
                out = self._read_local(reqs)
            elif self.options.cache_dir:
                out = self._read_cached(reqs)
            else:
                out = self._read_remote(reqs)
        self._count("bytes_read", sum(len(b) for b in out))
        return out

    def _read_local(self, reqs: list[tuple[ShardInfo, int, int]]) -> list[bytes]:
        out = []
        for shard, start, stop in reqs:
            path = self._local_path(shard.path)
            url = self._url(shard.path)
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise FileNotFoundError(errno.ENOENT, "shard file not found", url) from None
                self._remember_fd(path, fd)
                if self.options.verify_checksum and path not in self._verified:
                    self._check_digest(shard, url, _hash_fd(fd))
                    self._verified.add(path)
            else:
                self._fds.move_to_end(path)
            out.append(self._pread(fd, start, stop, url))
        return out

    def _read_remote(self, reqs: list[tuple[ShardInfo, int, int]]) -> list[bytes]:
        fs = self._filesystem()
        if self.options.verify_checksum:
            for shard in _unique_shards(reqs).values():
                if shard.path not in self._verified:
                    self._check_digest(shard, self._url(shard.path), self._hash_remote(fs, shard))
                    self._verified.add(shard.path)
        segments = _coalesce(reqs)
        step = self.options.max_request_bytes
        pieces = [
            (k, s, min(s + step, seg_stop))
            for k, (shard, seg_start, seg_stop, _) in enumerate(segments)
            for s in range(seg_start, seg_stop, step)
        ]

        def fetch(piece: tuple[int, int, int]) -> bytes:
            shard = segments[piece[0]][0]
            path = join(self._base, shard.path)
            return self._fetch_piece(fs, path, self._url(shard.path), piece[1], piece[2])

        results = self._run_all(fetch, pieces)
        parts: list[list[bytes]] = [[] for _ in segments]
        for (k, _, _), data in zip(pieces, results, strict=True):
            parts[k].append(data)
        out: list[bytes] = [b""] * len(reqs)
        for (_, seg_start, _, members), chunks in zip(segments, parts, strict=True):
            buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            view = memoryview(buf)
            for i in members:
                _, start, stop = reqs[i]
                out[i] = bytes(view[start - seg_start : stop - seg_start])
        return out

    def _read_cached(self, reqs: list[tuple[ShardInfo, int, int]]) -> list[bytes]:
        shards = _unique_shards(reqs)
        cpaths = {rel: self._cache_file(self._url(rel), s) for rel, s in shards.items()}
        pinned = set(cpaths.values())
        missing = [rel for rel in shards if not self._cache_lookup(cpaths[rel])]
        self._count("cache_hits", len(shards) - len(missing))
        if missing:
            self._fetch_into_cache([(shards[rel], cpaths[rel]) for rel in missing], pinned)
        if self.options.verify_checksum:
            for rel, shard in shards.items():
                self._verify_cached(shard, cpaths[rel], pinned)
        out = []
        for shard, start, stop in reqs:
            cpath = cpaths[shard.path]
            fd = self._fds.get(cpath)
            for _ in range(3):  # closed by the fd LRU meanwhile, then maybe evicted elsewhere
                if fd is not None:
                    break
                if not self._cache_lookup(cpath):
                    self._fetch_into_cache([(shard, cpath)], pinned)
                fd = self._fds.get(cpath)
            if fd is None:
                raise ShardReadError(f"{self.url(shard)}: cached copy {cpath} keeps disappearing")
            self._fds.move_to_end(cpath)
            out.append(self._pread(fd, start, stop, self.url(shard)))
        return out

    def _pread(self, fd: int, start: int, stop: int, url: str) -> bytes:
        want = stop - start
        self._count("requests")
        data = os.pread(fd, want, start)
        if len(data) == want:
            return data
        chunks = [data]
        got = len(data)
        while got < want:
            more = os.pread(fd, want - got, start + got)
            if not more:
                raise _truncated(url, start + got, start, stop)
            chunks.append(more)
            got += len(more)
        return b"".join(chunks)

    def _remember_fd(self, path: str, fd: int) -> None:
        old = self._fds.pop(path, None)
        if old is not None and old != fd:
            _close_quietly(old)
        self._fds[path] = fd
        while len(self._fds) > self.options.max_open_files:
            _close_quietly(self._fds.popitem(last=False)[1])

    def _forget_fd(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            _close_quietly(fd)

    # -- remote requests with retries ------------------------------------------------------------
    def _fetch_piece(self, fs: Any, path: str, url: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a remote file, retried and resumed at the first missing byte."""
        buf = bytearray()
        attempt = 0
        while True:
            pos = start + len(buf)
            before = len(buf)
            self._count("requests")
            try:
                if self._http:
                    from fsspec.asyn import sync

                    sync(fs.loop, _http_range, fs, path, pos, stop, buf)
                else:
                    buf += fs.cat_file(path, start=pos, end=stop)[: stop - pos]
            except Exception as exc:
                self._count("bytes_fetched", len(buf) - before)
                self._retry_or_raise(exc, url, start + len(buf), attempt, (start, stop))
                attempt += 1
                continue
            self._count("bytes_fetched", len(buf) - before)
            if len(buf) < stop - start:
                raise _truncated(url, start + len(buf), start, stop)
            return bytes(buf)

    def _fetch_whole(self, fs: Any, path: str, url: str) -> bytes:
        """A whole (small) remote file, retried on transient errors."""
        attempt = 0
        while True:
            self._count("requests")
            try:
                data = fs.cat_file(path)
            except Exception as exc:
                self._retry_or_raise(exc, url, 0, attempt, None)
                attempt += 1
                continue
            self._count("bytes_fetched", len(data))
            return data

    def _retry_or_raise(
        self,
        exc: Exception,
        url: str,
        offset: int,
        attempt: int,
        span: tuple[int, int] | None,
    ) -> None:
        """Sleep before the next attempt, or raise the error the caller should see."""
        if span is not None and _range_unsatisfiable(exc):
            raise _truncated(url, offset, *span) from None
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(errno.ENOENT, "file not found", url) from exc
        if isinstance(exc, PermissionError):
            raise PermissionError(errno.EACCES, f"access denied ({exc})", url) from exc
        if isinstance(exc, WdsLoaderError):
            raise exc
        if not _is_transient(exc):
            raise ShardReadError(f"{url}: read failed at byte offset {offset}: {exc!r}") from exc
        if attempt >= self.options.retries:
            raise ShardReadError(
                f"{url}: read failed at byte offset {offset} after {attempt} retries: {exc!r}"
            ) from exc
        self._count("retries")
        delay = min(self.options.backoff * 2**attempt, MAX_BACKOFF_S)
        logger.info("%s: retrying at byte offset %d in %.3fs after %r", url, offset, delay, exc)
        if delay > 0:
            time.sleep(delay)

    def _run_all(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(x) for x in items]`` on the thread pool; the first error once none is running."""
        if len(items) <= 1 or self.options.concurrency == 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.options.concurrency, "wdsloader-fetch")
        futures = [self._pool.submit(fn, x) for x in items]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        if pending:
            for f in pending:
                f.cancel()
            wait(pending)
        return [f.result() for f in futures]

    # -- checksums -------------------------------------------------------------------------------
    def verify(self, shard: ShardInfo) -> None:
        """Compare the sha256 of the whole shard file with ``shard.sha256``.

        Raises ShardFormatError naming the file on a mismatch, ValueError if the manifest has no
        checksum for it. With a cache, a corrupt cached copy is removed.
        """
        self._ensure_process()
        url = self.url(shard)
        if not shard.sha256:
            raise ValueError(f"{url}: the manifest has no sha256 for this shard")
        with self._lock:
            if self.is_local:
                path = self._local_path(shard.path)
                try:
                    with open(path, "rb") as f:
                        digest = _hash_fd(f.fileno())
                except FileNotFoundError:
                    raise FileNotFoundError(errno.ENOENT, "shard file not found", url) from None
                self._check_digest(shard, url, digest)
            elif self.options.cache_dir:
                cpath = self._cache_file(url, shard)
                if not self._cache_lookup(cpath):
                    self._fetch_into_cache([(shard, cpath)], {cpath})
                self._verified.discard(cpath)
                self._verify_cached(shard, cpath, {cpath})
            else:
                self._check_digest(shard, url, self._hash_remote(self._filesystem(), shard))

    def _check_digest(self, shard: ShardInfo, url: str, digest: str | None) -> None:
        if digest is None or not shard.sha256:
            return
        if digest != shard.sha256:
            raise ShardFormatError(
                f"{url}: sha256 mismatch (manifest {shard.sha256}, file {digest}): "
                "the shard is corrupt or was changed after the build"
            )

    def _hash_remote(self, fs: Any, shard: ShardInfo) -> str | None:
        if not shard.sha256:
            logger.warning("%s: no sha256 in the manifest, not verified", self.url(shard))
            return None
        sha = hashlib.sha256()
        step = self.options.max_request_bytes
        spans = [(s, min(s + step, shard.num_bytes)) for s in range(0, shard.num_bytes, step)]
        path, url = join(self._base, shard.path), self.url(shard)
        window = self.options.concurrency
        for i in range(0, len(spans), window):
            batch = spans[i : i + window]
            for data in self._run_all(lambda sp: self._fetch_piece(fs, path, url, *sp), batch):
                sha.update(data)
        return sha.hexdigest()

    def _verify_cached(self, shard: ShardInfo, cpath: str, pinned: set[str]) -> None:
        if cpath in self._verified:
            return
        fd = self._fds.get(cpath)
        if fd is None:
            if not self._cache_lookup(cpath):
                self._fetch_into_cache([(shard, cpath)], pinned)
            fd = self._fds[cpath]
        try:
            self._check_digest(shard, self.url(shard), _hash_fd(fd) if shard.sha256 else None)
        except ShardFormatError:
            self._forget_fd(cpath)
            _unlink_quietly(cpath)
            raise
        self._verified.add(cpath)

    # -- start-up check --------------------------------------------------------------------------
    def check_shards(self, shards: Sequence[ShardInfo]) -> None:
        """Check that every shard and index file exists, with the manifest's size where known.

        One listing per directory; files a listing does not show are probed one by one (some
        stores, e.g. plain HTTP servers, may not list). Raises FileNotFoundError naming the
        missing files, ShardFormatError naming a file whose size differs from the manifest.
        """
        self._ensure_process()
        with self._lock:
            fs = self._filesystem()
            groups: dict[str, list[tuple[str, int]]] = {}
            for s in shards:
                for rel, size in ((s.path, s.num_bytes), (s.idx_path, (s.num_samples + 1) * 8)):
                    groups.setdefault(posixpath.dirname(rel), []).append((rel, size))
            missing: list[str] = []
            for folder, files in groups.items():
                listing = self._list_dir(fs, join(self._base, folder) if folder else self._base)
                for rel, expected in files:
                    name = posixpath.basename(rel)
                    if listing is not None and name in listing:
                        size = listing[name]
                    else:
                        try:
                            size = fs.info(join(self._base, rel)).get("size")
                        except FileNotFoundError:
                            missing.append(self._url(rel))
                            continue
                    if size is not None and int(size) != expected:
                        raise ShardFormatError(
                            f"{self._url(rel)}: file has {size} bytes, the manifest says {expected}"
                        )
            if missing:
                shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise FileNotFoundError(
                    errno.ENOENT, f"{len(missing)} shard file(s) missing: {shown}", missing[0]
                )

    def _list_dir(self, fs: Any, path: str) -> dict[str, int | None] | None:
        """``{basename: size or None}`` of the files in one directory, or None if it cannot list."""
        try:
            fs.invalidate_cache(path)
            entries = fs.ls(path, detail=True)
        except Exception as exc:  # a listing only saves requests; files are then probed
            logger.debug("%s: no listing (%r); probing files one by one", path, exc)
            return None
        out: dict[str, int | None] = {}
        for e in entries:
            if e.get("type", "file") == "file":
                size = e.get("size")
                out[posixpath.basename(str(e["name"]).rstrip("/"))] = (
                    None if size is None else int(size)
                )
        return out

    # -- cache -----------------------------------------------------------------------------------
    def _cache_file(self, url: str, shard: ShardInfo) -> str:
        """Cache path of a remote file: a hash of its URL and the shard's identity, then its name."""
        key = f"{url}\0{shard.num_bytes}\0{shard.sha256 or ''}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        assert self.options.cache_dir is not None
        return os.path.join(self.options.cache_dir, f"wds-{digest}-{posixpath.basename(url)}")

    def _temp_file(self) -> tuple[int, str]:
        cache_dir = self.options.cache_dir
        assert cache_dir is not None
        os.makedirs(cache_dir, exist_ok=True)
        tmp = os.path.join(cache_dir, f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:16]}")
        return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), tmp

    def _cache_lookup(self, cpath: str) -> bool:
        """Open (or keep) a descriptor on a complete cached file and mark it recently used."""
        fd = self._fds.get(cpath)
        try:
            os.utime(cpath)
            st = os.stat(cpath)
        except FileNotFoundError:  # never cached, or evicted by another process
            self._forget_fd(cpath)
            return False
        if fd is not None:
            held = os.fstat(fd)
            if (held.st_ino, held.st_dev) == (st.st_ino, st.st_dev):
                self._fds.move_to_end(cpath)
                return True
            self._forget_fd(cpath)  # replaced by another process: drop the old inode
        try:
            fd = os.open(cpath, os.O_RDONLY)
        except FileNotFoundError:
            return False
        self._remember_fd(cpath, fd)
        return True

    def _fetch_into_cache(self, items: list[tuple[ShardInfo, str]], pinned: set[str]) -> None:
        """Download whole shards in parallel ranges into temp files, then rename them in place."""
        self._make_room(sum(s.num_bytes for s, _ in items), pinned)
        fs = self._filesystem()
        temps: list[tuple[ShardInfo, str, int, str]] = []
        try:
            for shard, cpath in items:
                fd, tmp = self._temp_file()
                temps.append((shard, cpath, fd, tmp))
            step = self.options.max_request_bytes
            jobs = [
                (
                    fd,
                    join(self._base, shard.path),
                    self.url(shard),
                    s,
                    min(s + step, shard.num_bytes),
                )
                for shard, _, fd, tmp in temps
                for s in range(0, shard.num_bytes, step)
            ]

            def download(job: tuple[int, str, str, int, int]) -> None:
                fd, path, url, start, stop = job
                _pwrite_all(fd, self._fetch_piece(fs, path, url, start, stop), start)

            self._run_all(download, jobs)
            while temps:
                shard, cpath, fd, tmp = temps[0]
                if self.options.verify_checksum and shard.sha256:
                    self._check_digest(shard, self.url(shard), _hash_fd(fd))
                    self._verified.add(cpath)
                os.fsync(fd)
                os.replace(tmp, cpath)
                temps.pop(0)
                self._remember_fd(cpath, fd)
                self._count("cache_misses")
        finally:
            for _, _, fd, tmp in temps:
                _close_quietly(fd)
                _unlink_quietly(tmp)

    def _make_room(self, incoming: int, pinned: set[str]) -> None:
        """Evict least recently used cached files until ``incoming`` more bytes fit the limit."""
        limit = self.options.cache_limit_bytes
        cache_dir = self.options.cache_dir
        if limit is None or cache_dir is None or not os.path.isdir(cache_dir):
            return
        total = 0
        candidates: list[tuple[int, int, str]] = []
        now = time.time()
        with os.scandir(cache_dir) as it:
            for entry in it:
                ours = _CACHE_NAME.match(entry.name)
                temp = entry.name.startswith(_TMP_PREFIX)
                if not (ours or temp):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if temp and now - st.st_mtime > _STALE_TMP_S:  # left by a crashed process
                    _unlink_quietly(entry.path)
                    continue
                total += st.st_size
                if ours and entry.path not in pinned:
                    candidates.append((st.st_mtime_ns, st.st_size, entry.path))
        candidates.sort()
        for _, size, path in candidates:
            if total + incoming <= limit:
                break
            self._forget_fd(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                total -= size  # another process evicted it first
                continue
            total -= size
            self._count("evictions")
            logger.debug("evicted %s (%d bytes) from the shard cache", path, size)


# -- helpers ---------------------------------------------------------------------------------------
async def _http_range(fs: Any, url: str, start: int, stop: int, sink: bytearray) -> None:
    """GET bytes [start, stop) of ``url`` with ``fs``'s aiohttp session, appending to ``sink``
    chunk by chunk, so the bytes that arrived survive a connection dropped mid-body."""
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{stop - 1}"
    headers["Accept-Encoding"] = "identity"
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as resp:
        status = resp.status
        if status == 416:
            raise _RangeNotSatisfiable(f"HTTP 416 for {url} at byte {start}")
        if status == 404:
            raise FileNotFoundError(errno.ENOENT, "HTTP 404", url)
        if status in (401, 403):
            raise PermissionError(errno.EACCES, f"HTTP {status}", url)
        if status not in (200, 206):
            raise _HTTPStatusError(status, url)
        skip = start if status == 200 else 0  # the server ignored the range
        if status == 206:
            content_range = resp.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {start}-"):
                raise _HTTPStatusError(
                    400, f"{url} (asked from byte {start}, got {content_range!r})"
                )
        need = stop - start
        while need > 0:
            chunk = await resp.content.read(_STREAM_CHUNK)
            if not chunk:
                break
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            chunk = chunk[:need]
            sink += chunk
            need -= len(chunk)


def _is_http(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if not {"http", "https"} & set(protocols):
        return False
    from fsspec.implementations.http import HTTPFileSystem

    return isinstance(fs, HTTPFileSystem)


def _is_transient(exc: BaseException) -> bool:
    """Whether a storage error is worth retrying (network, timeouts, server-side statuses)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if isinstance(exc, OSError):
        # s3fs maps S3 client errors (bad request, invalid range ...) to EINVAL
        return exc.errno != errno.EINVAL
    if isinstance(exc, asyncio.TimeoutError):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _range_unsatisfiable(exc: BaseException) -> bool:
    if isinstance(exc, _RangeNotSatisfiable):
        return True
    text = str(exc).lower()
    return (
        isinstance(exc, OSError)
        and exc.errno == errno.EINVAL
        and ("not satisfiable" in text or "invalidrange" in text)
    )


def _truncated(url: str, offset: int, start: int, stop: int) -> ShardFormatError:
    return ShardFormatError(
        f"{url}: truncated: no data at byte offset {offset} (reading bytes [{start}, {stop}))"
    )


def _unique_shards(reqs: list[tuple[ShardInfo, int, int]]) -> dict[str, ShardInfo]:
    out: dict[str, ShardInfo] = {}
    for shard, _, _ in reqs:
        out.setdefault(shard.path, shard)
    return out


def _coalesce(
    reqs: list[tuple[ShardInfo, int, int]],
) -> list[tuple[ShardInfo, int, int, list[int]]]:
    """Merge overlapping or adjacent ranges of each shard: ``(shard, start, stop, request ids)``."""
    by_shard: dict[str, list[int]] = {}
    for i, (shard, _, _) in enumerate(reqs):
        by_shard.setdefault(shard.path, []).append(i)
    segments: list[tuple[ShardInfo, int, int, list[int]]] = []
    for ids in by_shard.values():
        ids.sort(key=lambda i: reqs[i][1])
        shard, start, stop = reqs[ids[0]]
        members = [ids[0]]
        for i in ids[1:]:
            _, a, b = reqs[i]
            if a <= stop:
                stop = max(stop, b)
                members.append(i)
            else:
                segments.append((shard, start, stop, members))
                start, stop, members = a, b, [i]
        segments.append((shard, start, stop, members))
    return segments


def _hash_fd(fd: int) -> str:
    sha = hashlib.sha256()
    pos = 0
    while True:
        chunk = os.pread(fd, _HASH_CHUNK, pos)
        if not chunk:
            return sha.hexdigest()
        sha.update(chunk)
        pos += len(chunk)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
