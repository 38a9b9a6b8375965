"""Requests to remote storage with retries, timeouts and a deadline.

:class:`RemoteFiles` fetches byte ranges, file infos and listings of the files under one root
of an fsspec filesystem. Transient failures are retried with exponential backoff; a retry asks
only for the bytes not received yet (HTTP(S) range GETs use the filesystem's own aiohttp
session, with its headers, auth and client options; other filesystems, e.g. s3fs, gcsfs,
memory, re-send a failed request of ``fs.cat_file`` whole). On filesystems with an async API an
attempt still running at the deadline is cancelled. Errors name the URL, credentials redacted.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from wdsloader.errors import ShardFormatError, ShardReadError, WdsLoaderError
from wdsloader.io.options import ReadOptions
from wdsloader.io.storage import join
from wdsloader.io.transient import is_transient, permanent_failure, transient_cause

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 2.0
_STREAM_CHUNK = 1 << 18


class RemoteFiles:
    """The files under ``base`` of the filesystem ``fs``, read as ``options`` say (retries,
    backoff, deadline). ``url`` shows a path relative to the root in messages, ``count`` adds
    to the store's counters (``requests``, ``bytes_fetched``, ``retries``), ``redact`` removes
    credentials from text, ``observe`` receives each answered fetch's bytes and seconds (the
    store's :class:`~wdsloader.io.tuning.Probe`)."""

    def __init__(
        self,
        fs: Any,
        base: str,
        options: ReadOptions,
        *,
        url: Callable[[str], str],
        count: Callable[[str, int], None],
        redact: Callable[[object], str],
        observe: Callable[[int, float], None] | None = None,
    ) -> None:
        self.fs = fs
        self.base = base
        self.options = options
        self.http = is_http(fs)
        self._url = url
        self._count = count
        self._redact = redact
        self._observe = observe

    def fetch(self, rel: str, start: int = 0, stop: int | None = None) -> bytes:
        """Bytes [start, stop) of a file (the whole file if stop is None), retried on transient
        errors and resumed at the first byte not received. A file that ends before ``stop`` is
        truncated (:class:`ShardFormatError`)."""
        return self._timed(rel, start, stop, upto=False)

    def fetch_buffer(self, rel: str, start: int, stop: int) -> bytes | memoryview:
        """:meth:`fetch` of bytes [start, stop), answered by the filesystem's own buffer where
        it has one (obstore's ``cat_buffer``): the caller copies the bytes where they go,
        with no ``bytes`` made of them on the way."""
        return self._timed(rel, start, stop, upto=False, copy=False)

    def fetch_upto(self, rel: str, stop: int) -> bytes:
        """Bytes [0, stop) of a file, or all of it if it is shorter: a small file whose size is
        known in one ranged GET (no request for its size), with the retries of :meth:`fetch`."""
        return self._timed(rel, 0, stop, upto=True)

    def _timed(self, rel: str, start: int, stop: int | None, upto: bool, copy: bool = True) -> Any:
        t0 = time.perf_counter()
        data = self._fetch(rel, start, stop, upto, copy)
        if self._observe is not None:
            self._observe(len(data), time.perf_counter() - t0)
        return data

    def _fetch(self, rel: str, start: int, stop: int | None, upto: bool, copy: bool) -> Any:
        fs = self.fs
        ranged = "cat_file" if copy or not hasattr(fs, "cat_buffer") else "cat_buffer"
        path, url = join(self.base, rel), self._url(rel)
        buf = bytearray()
        clock = Deadline(self.options.deadline)
        attempt = 0
        while True:
            before = len(buf)
            pos = start + before
            self._count("requests", 1)
            try:
                if stop is None:
                    buf[:] = call_fs(fs, clock.remaining(), "cat_file", path)
                elif self.http:
                    run_coro(fs, clock.remaining(), http_range(fs, path, pos, stop, buf))
                else:
                    data = call_fs(fs, clock.remaining(), ranged, path, start=pos, end=stop)
                    if not buf and (len(data) == stop - pos or (upto and len(data) < stop - pos)):
                        # all of it in one answer: returned as it came (no copy)
                        self._count("bytes_fetched", len(data))
                        return data if isinstance(data, bytes) or not copy else bytes(data)
                    buf += memoryview(data)[: stop - pos]
            except Exception as exc:  # sorted by retry_or_raise: retried or raised, never lost
                self._count("bytes_fetched", len(buf) - before)
                offset = start + len(buf)
                self.retry_or_raise(exc, url, offset, attempt, stop is not None, clock)
                attempt += 1
                continue
            self._count("bytes_fetched", len(buf) - before)
            if stop is not None and len(buf) < stop - start and not upto:
                raise truncated(url, start + len(buf))
            return bytes(buf)

    def info(self, rel: str) -> dict[str, Any]:
        """``fs.info`` of a file under the root, with the retries and deadline of reads."""
        clock = Deadline(self.options.deadline)
        attempt = 0
        while True:
            self._count("requests", 1)
            try:
                info: dict[str, Any] = call_fs(
                    self.fs, clock.remaining(), "info", join(self.base, rel)
                )
                return info
            except Exception as exc:  # sorted by retry_or_raise: retried or raised, never lost
                self.retry_or_raise(exc, self._url(rel), None, attempt, False, clock)
                attempt += 1

    def list_dir(self, folder: str) -> dict[str, int | None] | None:
        """``{basename: size or None}`` of the files in ``folder`` (relative to the root; ``""``
        is the root), or None if it cannot be listed."""
        path = join(self.base, folder) if folder else self.base
        try:
            self.fs.invalidate_cache(path)
            entries = call_fs(self.fs, self.options.deadline, "ls", path, detail=True)
        except Exception as exc:  # a listing only saves requests; the files are then probed
            shown = self._redact(f"{path}: no listing ({exc!r}); probing files one by one")
            logger.debug("%s", shown)
            return None
        out: dict[str, int | None] = {}
        for e in entries:
            if e.get("type", "file") == "file":
                name = posixpath.basename(str(e["name"]).rstrip("/"))
                name = urllib.parse.unquote(name) if self.http else name
                out[name] = None if e.get("size") is None else int(e["size"])
        return out

    def retry_or_raise(
        self,
        exc: Exception,
        url: str,
        offset: int | None,
        attempt: int,
        ranged: bool,
        clock: Deadline,
    ) -> None:
        """Sleep before the next attempt, or raise the error the caller should see (its text
        and cause free of credentials: the storage error is described, not chained)."""
        at = f" at byte offset {offset}" if offset is not None else ""
        if ranged and range_unsatisfiable(exc):
            raise truncated(url, offset or 0) from None
        if isinstance(exc, WdsLoaderError):
            raise exc
        if not is_transient(exc):
            setup = permanent_failure(exc)
            if setup is not None:
                link, what = setup
                raise ShardReadError(
                    f"{url}: read failed{at}: {what}: {self.describe(link)}"
                ) from None
            if isinstance(exc, FileNotFoundError):
                raise FileNotFoundError(errno.ENOENT, "file not found", url) from None
            if isinstance(exc, PermissionError):
                raise PermissionError(
                    errno.EACCES, f"access denied ({self.describe(exc)})", url
                ) from None
            raise ShardReadError(f"{url}: read failed{at}: {self.describe(exc)}") from None
        # described by its network or server error, not by the FileNotFoundError (fsspec's
        # HTTP info()) or OSError (s3fs) a client wrapped it in
        shown = transient_cause(exc)
        delay, why = next_retry(self.options, attempt, clock)
        if why is not None:
            raise ShardReadError(
                f"{url}: read failed{at} after {attempt} retries in "
                f"{clock.elapsed():.1f}s{why}: {self.describe(shown)}"
            ) from None
        self._count("retries", 1)
        logger.info("%s: retrying%s in %.3fs after %s", url, at, delay, self.describe(shown))
        if delay > 0:
            time.sleep(delay)

    def describe(self, exc: BaseException) -> str:
        """A storage error in words, credentials redacted; timeouts say which limits applied."""
        inner = exc.__cause__ if not str(exc) and exc.__cause__ is not None else exc
        text = f"{type(inner).__name__}: {inner}" if str(inner) else type(inner).__name__
        if is_timeout(exc) or is_timeout(inner):
            o = self.options
            deadline = "none" if o.deadline is None else f"{o.deadline:g}s"
            text += f" (timed out: connect_timeout={o.connect_timeout:g}s, "
            text += f"read_timeout={o.read_timeout:g}s, deadline={deadline})"
        return self._redact(text)


async def http_range(fs: Any, url: str, start: int, stop: int, sink: bytearray) -> None:
    """GET bytes [start, stop) of ``url`` with ``fs``'s aiohttp session, appending to ``sink``
    chunk by chunk, so the bytes that arrived survive a connection dropped mid-body."""
    kw = dict(fs.kwargs)
    headers = {**(kw.pop("headers", None) or {}), "Accept-Encoding": "identity"}
    headers["Range"] = f"bytes={start}-{stop - 1}"
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as resp:
        if resp.status == 404:
            raise FileNotFoundError(errno.ENOENT, "HTTP 404", url)
        resp.raise_for_status()  # ClientResponseError: its status decides about retries
        skip = start if resp.status == 200 else 0  # 200: the server ignored the range
        content_range = resp.headers.get("Content-Range", "")
        if resp.status == 206 and not content_range.startswith(f"bytes {start}-"):
            raise ValueError(f"asked for bytes from {start}, got {content_range!r}")
        need = stop - start
        while need > 0:
            chunk = await resp.content.read(_STREAM_CHUNK)
            if not chunk:
                break
            if skip:
                chunk, skip = chunk[skip:], max(skip - len(chunk), 0)
            chunk = chunk[:need]
            sink += chunk
            need -= len(chunk)


def next_retry(options: ReadOptions, attempt: int, clock: Deadline) -> tuple[float, str | None]:
    """After failed attempt ``attempt`` (0-based) of a request under ``options``: the wait
    before the next (``backoff`` doubled each time, capped at :data:`MAX_BACKOFF_S`) and None,
    or the wait and why no attempt follows (``""``: the retries are used up; else the deadline
    that ``clock`` reaches before the wait ends, as a clause for the error's text)."""
    delay = min(options.backoff * 2**attempt, MAX_BACKOFF_S)
    left = clock.remaining()
    if left is not None and left <= delay:
        return delay, f", the deadline of {clock.limit:g}s reached"
    return delay, "" if attempt >= options.retries else None


class Deadline:
    """Time left of a ``limit`` in seconds (None: no limit) started when made."""

    __slots__ = ("_start", "limit")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self._start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def remaining(self) -> float | None:
        return None if self.limit is None else max(0.0, self.limit - self.elapsed())


def call_fs(fs: Any, timeout: float | None, method: str, *args: Any, **kwargs: Any) -> Any:
    """``fs.<method>(*args, **kwargs)``; on a filesystem with an async API (HTTP, S3, GCS ...)
    its coroutine runs on the filesystem's loop and is cancelled after ``timeout`` seconds."""
    if getattr(fs, "async_impl", False) and hasattr(fs, f"_{method}"):
        return run_coro(fs, timeout, getattr(fs, f"_{method}")(*args, **kwargs))
    return getattr(fs, method)(*args, **kwargs)


def run_coro(fs: Any, timeout: float | None, coro: Any) -> Any:
    """Run ``coro`` on ``fs``'s event loop from this thread, cancelled after ``timeout`` s (a
    timeout raises fsspec's FSTimeoutError, a TimeoutError)."""
    from fsspec.asyn import sync

    return sync(fs.loop, _within, coro, timeout)


async def _within(coro: Any, timeout: float | None) -> Any:
    return await asyncio.wait_for(coro, timeout)


def is_timeout(exc: BaseException) -> bool:
    """A timeout of the client (aiohttp, botocore) or of the deadline."""
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or "Timeout" in type(exc).__name__


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP(S) filesystem."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if not {"http", "https"} & set(protocols):
        return False
    from fsspec.implementations.http import HTTPFileSystem

    return isinstance(fs, HTTPFileSystem)


def range_unsatisfiable(exc: BaseException) -> bool:
    """HTTP 416 (aiohttp), or s3fs's translation of S3's InvalidRange."""
    if getattr(exc, "status", None) == 416:
        return True
    text = str(exc).lower()
    return (
        isinstance(exc, OSError)
        and exc.errno == errno.EINVAL
        and ("not satisfiable" in text or "invalidrange" in text)
    )


def truncated(url: str, offset: int) -> ShardFormatError:
    """The error for a file that has no data at ``offset``."""
    return ShardFormatError(f"{url}: truncated: the file has no data at byte offset {offset}")
