"""Bytes of shards for the loader's workers: indexes, byte ranges, checksums and a local shard cache.

:class:`ShardStore` reads the shard indexes and any ``[start, stop)`` byte ranges of the shards
under a dataset root that is a local folder or any fsspec URL. ``ShardStore(root, options)``
returns the implementation :mod:`wdsloader.io.store` selects for the root and options:

- Local roots (:class:`~wdsloader.io.file_store.LocalStore`): each shard is opened once (a small
  LRU of descriptors) and read with ``os.pread``.
- Remote roots (:class:`~wdsloader.io.remote_store.RemoteStore`): overlapping or adjacent ranges
  of a shard are merged, split into requests of at most ``max_request_bytes`` and fetched by a
  thread pool. Transient failures are retried with exponential backoff; a retry asks only for
  the bytes not received yet (HTTP(S) range GETs use the filesystem's own aiohttp session, with
  its headers, auth and client options; other filesystems, e.g. s3fs, gcsfs, memory, re-send a
  failed request of ``fs.cat_file`` whole). Connect and read timeouts reach the HTTP and S3
  clients, and a deadline bounds each request with its retries (see :class:`ReadOptions`; the
  requests: :mod:`wdsloader.io.retry`; the ranges: :mod:`wdsloader.io.ranges`). Messages and
  logs show URLs and storage errors with credentials redacted (:mod:`wdsloader.redact`).
- Cache (``cache_dir``, remote roots only; :class:`~wdsloader.io.file_store.CachedStore`): the
  first access to a shard downloads it whole into a
  :class:`~wdsloader.io.shard_cache.ShardCache`; later reads are local preads.

A store does no I/O when built and pickles to its root and options (DataLoader workers); the
filesystem, threads and descriptors are opened lazily in each process, and reset after a fork.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, ClassVar

import numpy as np

from wdsloader.errors import ShardFormatError
from wdsloader.format import ShardInfo, decode_index
from wdsloader.io.options import ReadOptions
from wdsloader.io.ranges import Cut, Request
from wdsloader.io.remote_fs import remote_filesystem
from wdsloader.io.request_pool import RequestPool, wait_all
from wdsloader.io.retry import Deadline, RemoteFiles, call_fs, next_retry
from wdsloader.io.setup_errors import setup_error
from wdsloader.io.shard_cache import OpenFiles
from wdsloader.io.storage import join
from wdsloader.io.store import store_class
from wdsloader.io.store_checks import StoreChecks
from wdsloader.io.transient import is_transient
from wdsloader.io.tuning import MAX_CONCURRENCY, Probe, Tuning, tune
from wdsloader.redact import redact, secrets_of

__all__ = ["STAT_KEYS", "ReadOptions", "Request", "ShardStore"]

STAT_KEYS = tuple(
    "requests bytes_read bytes_fetched retries cache_hits cache_misses evictions".split()
)
# indexes of at most this many bytes in all are read once and pickled with the store
SHIP_INDEX_BYTES = 64 << 20
# index requests in flight at once (each a few KiB: the round trips, not the link, bound them;
# at the shards' 32, 1,000 shards' indexes took 31 round trips before the first batch)
INDEX_CONCURRENCY = 128


class ShardStore(RequestPool, StoreChecks):
    """Reads indexes and byte ranges of the shards under one dataset root (path or fsspec URL).

    ``ShardStore(root, options)`` builds the implementation registered for the root's kind
    (:func:`wdsloader.io.store.store_kind`). Calls on one store are serialized by a lock; the
    concurrency is inside a call, except that a remote store waits for its requests without
    the lock (those of calls made meanwhile queue behind them on its one pool). ``stats`` counts ``requests`` (storage reads issued, retries
    included), ``bytes_read`` (returned by :meth:`read_ranges`), ``bytes_fetched`` (received
    from remote storage), ``retries``, ``cache_hits``/``cache_misses`` (per shard and call) and
    ``evictions``.
    """

    is_local: ClassVar[bool] = False
    _PICKLED: ClassVar[tuple[str, ...]] = ("root", "options", "_shipped", "_measured", "readers")
    _SHIPS_INDEXES: ClassVar[bool] = True  # see ship_indexes
    _READ_LOCKED: ClassVar[bool] = True  # False: _read takes the lock itself where it must
    # True: this process forks no worker processes (none, threads, or spawned ones), so
    # every read goes through the shards' transport from the first (the manifest's)
    reads_here: bool = False

    def __new__(
        cls, root: str | os.PathLike[str] = "", options: ReadOptions | None = None
    ) -> ShardStore:
        if cls is ShardStore:  # the registry chooses the implementation
            cls = store_class(os.fspath(root), options if options is not None else ReadOptions())
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike[str], options: ReadOptions | None = None) -> None:
        text = os.fspath(root)
        self.root = text.rstrip("/") or text
        self.options = options if options is not None else ReadOptions()
        self._shipped: dict[str, np.ndarray] = {}  # indexes pickled with the store
        # the path's round trip and rate measured here, pickled with the store (workers start
        # tuned): (rtt_s, bytes_per_s)
        self._measured: tuple[float | None, float | None] = (None, None)
        self.readers = 1  # the node's reading processes sharing its link (see tune)
        self._init_runtime()

    # -- process-local state ---------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._remote: RemoteFiles | None = None
        self._remote_final = False  # False: not the shards' client (until the first shard read)
        self._pool: ThreadPoolExecutor | None = None
        self._queued = 0  # work submitted to the pool and not over
        self._files = OpenFiles(self.options.max_open_files)
        self._indexes: dict[str, np.ndarray] = {}
        for key, offsets in self._shipped.items():
            offsets.flags.writeable = False  # unpickled arrays are writeable
            self._indexes[key] = offsets
        self._verified: set[str] = set()
        self._probe = Probe(*self._measured)
        self._tuned: Tuning | None = None  # fixed once the path is measured
        self._secrets = secrets_of(self.options.storage_options, self.root)
        self._shown_root = redact(self.root, self._secrets)

    def _ensure_process(self) -> None:
        """After a fork, drop the parent's threads, loop-bound sessions and descriptors."""
        if self._pid != os.getpid():
            inherited = self._files
            self._init_runtime()
            inherited.close_all()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._PICKLED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._shown_root!r}, {self.options!r})"

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
        return False

    def url(self, shard: ShardInfo) -> str:
        """Full path or URL of a shard, for messages (credentials redacted)."""
        return self._url(shard.path)

    def redact(self, text: object) -> str:
        """``text`` with this store's credentials (URL userinfo, secret storage options, signed
        query strings) replaced by ``***``."""
        return redact(text, self._secrets)

    def _url(self, rel: str) -> str:
        return f"{self._shown_root}/{rel}"

    def _storage(self, data: bool = False) -> RemoteFiles:
        """The files under the root, read with this store's retries (opened on first use).
        ``data``: for shards' bytes (the obstore transport starts only for these in a process
        that may still fork workers; see :func:`~wdsloader.io.remote_fs.remote_filesystem`)."""
        data = data or self.reads_here
        if self._remote is None or (data and not self._remote_final):
            # the client's own retries off: RemoteFiles retries, under the deadline
            fs, base, self._remote_final = remote_filesystem(
                self.root,
                self.options,
                max_connections=self.options.concurrency or MAX_CONCURRENCY,
                data=data,
            )
            self._remote = RemoteFiles(
                fs,
                base,
                self.options,
                url=self._url,
                count=self._count,
                redact=self.redact,
                observe=self._probe.add,
            )
        return self._remote

    def tuning(self) -> Tuning:
        """How remote reads go now: request size, requests in flight and read-ahead, derived
        from the path measured on the first requests (:func:`wdsloader.io.tuning.tune`), the
        values set in :class:`ReadOptions` kept; fixed once the path is measured."""
        if self._tuned is not None:
            return self._tuned
        o, probe = self.options, self._probe
        tuned = tune(
            probe.rtt_s,
            probe.bytes_per_s,
            request_bytes=o.max_request_bytes,
            concurrency=o.concurrency,
            readahead_bytes=o.readahead_bytes,
            readers=self.readers,
        )
        if probe.measured:
            self._tuned = tuned
        return tuned

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
            offsets = self._load_index(shard)
            self._indexes[shard.idx_path] = offsets
            return offsets

    def load_indexes(self, shards: Sequence[ShardInfo]) -> None:
        """Read the indexes of ``shards`` not read yet (remotely up to
        :data:`INDEX_CONCURRENCY` at once, or ``options.concurrency`` where it is set; later
        :meth:`index` calls answer from memory)."""
        self._ensure_process()
        with self._lock:
            todo = list({s.idx_path: s for s in shards if s.idx_path not in self._indexes}.values())
            if self.is_local or len(todo) <= 1:
                found = self._run_all(self._load_index, todo)
            else:  # on threads of their own: no data read is queued yet to go first
                most = self.options.concurrency or INDEX_CONCURRENCY
                with ThreadPoolExecutor(min(len(todo), most), "wdsloader-index") as p:
                    found = wait_all([p.submit(self._load_index, s) for s in todo])
            for shard, offsets in zip(todo, found, strict=True):
                self._indexes[shard.idx_path] = offsets

    def ship_indexes(self, shards: Sequence[ShardInfo], limit: int = SHIP_INDEX_BYTES) -> bool:
        """Read the indexes of ``shards`` now (in parallel) and keep them in the store's pickled
        state, so that workers do not request them again; a no-op returning False when the
        store reads local index files (cheap in each worker) or when they would take more than
        ``limit`` bytes (workers then read those they use)."""
        if not self._SHIPS_INDEXES or sum((s.num_samples + 1) * 8 for s in shards) > limit:
            return False
        self.load_indexes(shards)
        with self._lock:
            self._shipped = {s.idx_path: self._indexes[s.idx_path] for s in shards}
            self._measured = (self._probe.rtt_s, self._probe.bytes_per_s)
        return True

    def open_split(self, shards: Sequence[ShardInfo], check: bool) -> None:
        """What a loader does with its split's shards before planning: with ``check``,
        :meth:`check_shards`, then :meth:`ship_indexes`. Remotely the check's listing is in
        flight while the indexes are read (a round trip less before the first batch); its
        error wins over an index's, so a missing shard is named as such."""
        if not check or self.is_local:
            if check:
                self.check_shards(shards)
            self.ship_indexes(shards)
            return
        self._ensure_process()
        with self._lock:
            self._storage()  # one client for both, opened before they start
        with ThreadPoolExecutor(1, "wdsloader-check") as checker:
            checked = checker.submit(self.check_shards, shards)
            try:
                self.ship_indexes(shards)
            except BaseException:
                checked.result()  # the check's error first
                raise
            checked.result()

    def read_root_file(self, rel: str) -> bytes:
        """A small file under the root (``manifest.json``) read whole through the store's
        filesystem, so that the shards are read with the client that read it (its set-up,
        credentials and region once per process); transient errors retried under the
        options' retries and deadline, any other error (and a set-up mistake) raised as the
        client raised it, for the caller to word."""
        self._ensure_process()
        with self._lock:
            remote = self._storage()
        # not through remote.fetch: the first request's time (the client's set-up with it) is
        # no round trip for the probe, and its errors reach the caller as the client raised them
        fs, path, o = remote.fs, join(remote.base, rel), self.options
        s3fs = getattr(fs, "max_concurrency", None) is not None  # one GET, no HEAD (cat_whole)
        whole = {"max_concurrency": 1} if s3fs else {}
        clock = Deadline(o.deadline)
        for attempt in range(o.retries + 1):
            try:
                data = call_fs(fs, clock.remaining(), "cat_file", path, **whole)
                return bytes(data)
            except Exception as exc:  # a transient error retried, any other raised as it is
                delay, last = next_retry(o, attempt, clock)
                stop = last is not None or not is_transient(exc)
                if stop or setup_error(exc, self.root) is not None:
                    raise
                self._count("retries", 1)
                time.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _load_index(self, shard: ShardInfo) -> np.ndarray:
        """The checked, read-only offsets of a shard's index file, read now."""
        url = self._url(shard.idx_path)
        expected = (shard.num_samples + 1) * 8
        try:
            data = self._index_bytes(shard, expected)
        except FileNotFoundError:
            raise ShardFormatError(f"{url}: index file not found") from None
        if len(data) != expected:
            has = f"more than {expected}" if len(data) > expected else str(len(data))
            raise ShardFormatError(
                f"{url}: index has {has} bytes, expected {expected} "
                f"({shard.num_samples} samples + 1 end offset)"
            )
        offsets = decode_index(data, source=url)
        if offsets[0] < 0 or offsets[-1] > shard.num_bytes:
            raise ShardFormatError(
                f"{url}: offsets {offsets[0]}..{offsets[-1]} fall outside the shard's "
                f"{shard.num_bytes} bytes"
            )
        offsets.flags.writeable = False
        return offsets

    def _index_bytes(self, shard: ShardInfo, expected: int) -> bytes:
        """The index file of ``shard`` (FileNotFoundError if there is none): its ``expected``
        bytes and one more if the file is longer, in one ranged request (the manifest gives
        the size: no request for it)."""
        return self._storage().fetch_upto(shard.idx_path, expected + 1)

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """A small file beside ``shard`` (see :meth:`wdsloader.io.store.Store.read_side_file`);
        each implementation reads it its way."""
        raise NotImplementedError(f"{type(self).__name__} reads no side files")

    # -- byte ranges -----------------------------------------------------------------------------
    def read_ranges(self, requests: Sequence[Request]) -> list[bytes]:
        """The bytes of each ``(shard, start, stop)`` range, in request order.

        Data missing at the end of a file raises :class:`ShardFormatError` naming the shard and
        the byte offset ("truncated"); a missing shard FileNotFoundError naming it; a read that
        keeps failing :class:`ShardReadError` naming the URL and the byte offset.
        """
        self._ensure_process()
        reqs, _, _ = self._checked(requests)
        if not reqs:
            return []
        with self._lock if self._READ_LOCKED else nullcontext():
            out = self._read(reqs)
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
        reqs, positions, total = self._checked(requests)
        self._ensure_process()
        if cuts is not None and len(cuts) != len(reqs):
            raise ValueError(f"{len(cuts)} lists of cuts for {len(reqs)} requests")
        return self._read_joined(reqs, positions, total, out, cuts), positions

    def _checked(self, requests: Sequence[Request]) -> tuple[list[Request], list[int], int]:
        """The requests with int bounds, where each starts back to back, and their total size;
        ValueError naming the shard of an invalid range."""
        # a request of exact ints is kept as it is: no second tuple per sample alive during
        # the read (fewer objects for the garbage collector to track and promote)
        reqs = [
            r
            if type(r) is tuple and type(r[1]) is int and type(r[2]) is int
            else (r[0], int(r[1]), int(r[2]))
            for r in requests
        ]
        positions, total = [], 0
        for shard, start, stop in reqs:
            if start < 0 or stop < start:
                raise ValueError(f"{self.url(shard)}: invalid byte range [{start}, {stop})")
            positions.append(total)
            total += stop - start
        return reqs, positions, total

    def _read(self, reqs: list[Request]) -> list[bytes]:
        """The bytes of each (checked, non-empty) request; called under the lock (unless
        ``_READ_LOCKED`` is False)."""
        raise NotImplementedError

    def _read_joined(
        self,
        reqs: list[Request],
        positions: list[int],
        total: int,
        out: np.ndarray | None,
        cuts: Sequence[Sequence[Cut]] | None,
    ) -> bytes | np.ndarray:
        """The buffer of :meth:`read_joined` (``positions``: where each request starts)."""
        raise NotImplementedError
