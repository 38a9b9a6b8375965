"""The lock that keeps a second build out of an output folder while a build runs there.

``OUTPUT/_build.lock`` is created with an exclusive create (local: ``O_CREAT | O_EXCL``; other
filesystems: fsspec's ``open(path, "xb")``, which memory:// honours and s3fs sends as a
conditional PUT, ``If-None-Match: *``) and holds the build's fingerprint, host, pid, start time
and a random token. A build that finds the lock held stops before it touches anything.

A lock is stale, and taken over with a warning, when its holder is a process of this host that
is gone (a crashed or killed build: its rerun resumes), or when neither the lock nor a finished
block of its build changed for ``lock_timeout`` seconds; ``break_lock=True`` takes any lock.

What is not airtight, honestly: a filesystem without exclusive create (``open(path, "xb")``
unsupported) gets a check-then-write, and an S3-compatible server that ignores ``If-None-Match``
turns the create into a plain PUT: two builds starting within the same moment can then both
believe they hold the lock (each reads its token back, which narrows but does not close that
window). Taking over a stale lock re-reads it just before removing it; a build that takes it in
between can still lose its fresh lock. The holder checks that the lock is still its own before it
writes the manifest. Hosts compare by name, lock ages by the holders' clocks.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from types import TracebackType
from typing import Any

from build_shards.errors import BuildError, naming_options
from wdsloader.io.setup_errors import setup_errors_in_one_line
from wdsloader.io.storage import is_local, join, write_atomic

log = logging.getLogger("build_shards")

LOCK_NAME = "_build.lock"
DEFAULT_LOCK_TIMEOUT = 24 * 3600.0  # seconds without activity before another host's lock is stale
_TAKE_ATTEMPTS = 3

_held: set[str] = set()  # tokens of the locks this process holds (a second thread is refused)
_held_guard = threading.Lock()


class OutputLockedError(BuildError):
    """Another build holds the output folder (or took it over while this build ran)."""


def _pid_alive(pid: Any) -> bool:
    """True unless ``pid`` is known to be gone (only POSIX can tell; elsewhere: alive)."""
    if os.name != "posix" or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user
        return True
    return True


def _entry_time(entry: dict[str, Any]) -> float | None:
    """Modification time (epoch seconds) of an fsspec ``ls``/``info`` entry, when it has one."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = entry.get(name)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, _dt.datetime):
            return value.timestamp()
    return None


class BuildLock:
    """The lock of one build on ``root``: :meth:`acquire` or raise, :meth:`check`, :meth:`release`
    (also a context manager)."""

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        fingerprint: str,
        timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        break_lock: bool = False,
    ) -> None:
        if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
            raise ValueError(f"lock_timeout must be a positive number or None, got {timeout!r}")
        self.fs, self.root, self.url = fs, root, url.rstrip("/")
        self.path = join(root, LOCK_NAME)
        self.timeout, self.break_lock = timeout, break_lock
        self.token = uuid.uuid4().hex
        self.body = {
            "fingerprint": fingerprint,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "token": self.token,
        }

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # -- acquire -------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise OutputLockedError when it is held, and
        StorageSetupError (one line) when the output's storage cannot be used (a missing
        bucket, a dead endpoint, refused credentials): the lock is a build's first write."""
        with setup_errors_in_one_line(self.url, fs=self.fs):
            self._acquire()

    def _acquire(self) -> None:
        data = json.dumps(self.body, indent=1).encode()
        for _ in range(_TAKE_ATTEMPTS):
            if self._create(data):
                with _held_guard:
                    _held.add(self.token)
                return
            holder = self._read()
            if holder is None and not self.fs.exists(self.path):
                continue  # released in the meantime
            reason = "break_lock=True" if self.break_lock else self._stale_reason(holder)
            if reason is None:
                raise naming_options(OutputLockedError(self._held_message(holder)), "break_lock")
            if self._read() != holder:
                continue  # someone else took it over first: judge the new holder
            log.warning("taking over the lock of %s (%s): %s", self.url, reason, holder)
            try:
                self.fs.rm_file(self.path)
            except FileNotFoundError:
                pass
        raise OutputLockedError(
            f"{self.url}: could not take the lock {self.path}: other builds keep taking it"
        )

    def _create(self, data: bytes) -> bool:
        """Create the lock file exclusively; False when it exists."""
        if is_local(self.fs):
            os.makedirs(self.root, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return True
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):  # no exclusive create: check, then write
            log.debug("%s has no exclusive create: the lock is a check-then-write", self.fs)
            if self.fs.exists(self.path):
                return False
            write_atomic(self.fs, self.path, data)
        holder = self._read()  # a server that ignored the condition: the last writer wins
        return holder is not None and holder.get("token") == self.token

    def _read(self) -> dict[str, Any] | None:
        """The lock's content; None when it is missing or unreadable (being written)."""
        self.fs.invalidate_cache(self.path)
        try:
            holder = json.loads(self.fs.cat_file(self.path))
        except (FileNotFoundError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _stale_reason(self, holder: dict[str, Any] | None) -> str | None:
        """Why the lock ``holder`` may be taken over, or None while it counts as held."""
        if holder is not None and holder.get("host") == socket.gethostname():
            pid = holder.get("pid")
            if pid == os.getpid():
                with _held_guard:
                    if holder.get("token") not in _held:
                        return "left behind by this process"
            elif not _pid_alive(pid):
                return f"its build (pid {pid} on this host) is gone"
        if self.timeout is None:
            return None
        idle = time.time() - self._last_activity(holder)
        if idle > self.timeout:
            return f"no activity for {idle:.0f} s, over lock_timeout={self.timeout:g}"
        return None

    def _last_activity(self, holder: dict[str, Any] | None) -> float:
        """The latest of the lock's start (the lock file's time when it is unreadable) and its
        build's finished block records (a heartbeat that costs nothing: a running build writes
        them anyway)."""
        times = []
        started = holder.get("started") if holder else None
        if isinstance(started, int | float):
            times.append(float(started))
        else:
            try:
                times.append(_entry_time(self.fs.info(self.path)) or time.time())
            except FileNotFoundError:
                pass
        try:
            entries = self.fs.ls(join(self.root, "_build"), detail=True)
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if posixpath.basename(entry["name"]).startswith("block-"):
                times.append(_entry_time(entry) or 0.0)
        return max(times, default=time.time())  # nothing known: as if just now (held)

    def _held_message(self, holder: dict[str, Any] | None) -> str:
        if holder is None:
            who = f"an unreadable lock file {self.path}"
        else:
            started = holder.get("started")
            when = (
                _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds")
                if isinstance(started, int | float)
                else "?"
            )
            same = (
                " (the same build)" if holder.get("fingerprint") == self.body["fingerprint"] else ""
            )
            who = (
                f"host {holder.get('host')!s}, pid {holder.get('pid')!s}, started {when}, "
                f"fingerprint {str(holder.get('fingerprint'))[:12]}{same}; lock file {self.path}"
            )
        return (
            f"{self.url} is being written by another build ({who}): two builds in one folder "
            "would destroy each other's files, so this one stops without touching anything. "
            "Wait for that build to finish; if it is dead, pass lock=LockOptions(break_lock=True)"
        )

    # -- while held ----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise OutputLockedError when the lock is no longer this build's (it was broken)."""
        holder = self._read()
        if holder is None or holder.get("token") != self.token:
            raise OutputLockedError(
                f"{self.url}: the lock of this build was taken over by another build "
                f"({holder or 'lock file gone'}) while it ran: stopping without writing "
                "manifest.json"
            )

    def release(self) -> None:
        """Remove the lock when it is still this build's."""
        with _held_guard:
            _held.discard(self.token)
        holder = self._read()
        if holder is not None and holder.get("token") == self.token:
            try:
                self.fs.rm_file(self.path)
            except FileNotFoundError:
                pass
        else:
            log.warning("the lock of %s was taken over by another build: left to it", self.url)
