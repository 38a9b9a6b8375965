"""What the processes sharing a shard cache folder still need, and the lock that sizes it.

Each reading process (a rank, or a DataLoader worker) that plans its pass keeps a ledger in the
cache folder: for every cached file it reads in this pass, the first and the last position
(batch of its pass) it is read at, and how far it has come. A ledger is two files: a lock file
the owner holds an exclusive ``flock`` on while it lives, and the claims, replaced whole as the
pass goes on. A ledger whose lock file is not held belongs to a process that is gone (a crash
or a kill): it is ignored and removed, so nothing a dead process left blocks the next run.

:func:`space_lock` serializes taking room in the folder (eviction and reservation) between the
processes of a node; the kernel releases it when its holder dies. The files evicted during an
epoch are recorded (:func:`note_evicted`): a reader of that epoch whose claims came after the
eviction (a rank or a worker that started late) reads them by ranges, never downloads them twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "LEDGER_PREFIX",
    "Ledger",
    "cache_usage",
    "evicted",
    "forget_evictions",
    "needs",
    "note_evicted",
    "readers",
    "space_lock",
    "streamed",
]

LEDGER_PREFIX = ".wds-need-"
_SPACE_LOCK = ".wds-space.lock"
_USAGE = ".wds-usage.json"
_EVICTED = ".wds-evicted.json"


@contextlib.contextmanager
def space_lock(cache_dir: str) -> Iterator[None]:
    """Hold the folder's room lock (waiting for another process holding it)."""
    os.makedirs(cache_dir, exist_ok=True)
    fd = os.open(os.path.join(cache_dir, _SPACE_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def held_by_another(path: str) -> bool:
    """Whether a live process holds a ``flock`` on the file at ``path`` (False when it is gone
    or was never locked)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


class Ledger:
    """This process's claims on the files of ``cache_dir`` (by basename) for its current pass."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        base = os.path.join(cache_dir, f"{LEDGER_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self.path, self._lock_path = base + ".json", base + ".lock"
        self._fd: int | None = None
        self._uses: dict[str, tuple[int, int]] = {}
        self._streamed: set[str] = set()
        self._at = 0

    def expect(self, uses: Mapping[str, tuple[int, int]]) -> None:
        """Claim the files of a new pass: ``{basename: (first, last position read at)}``."""
        self._uses, self._at, self._streamed = dict(uses), 0, set()
        if self._fd is None:
            os.makedirs(self.cache_dir, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process lives
            self._fd = fd
        self._write()

    def done(self, position: int) -> None:
        """Positions before ``position`` are read: files whose last read is before it are no
        longer needed by this process."""
        self._at = position
        left = {name: use for name, use in self._uses.items() if use[1] >= position}
        if len(left) != len(self._uses):  # rewritten only when a file is released
            self._uses = left
            self._write()

    def stream(self, names: set[str]) -> None:
        """Files this pass reads by ranged requests (no room): the node's other readers read
        them so too this pass rather than download them after those bytes were fetched."""
        if not names <= self._streamed:
            self._streamed |= names
            self._write()

    def close(self) -> None:
        """Release every claim (the end of a pass, or the store closed)."""
        self._uses, self._streamed = {}, set()
        for path in (self.path, self._lock_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self) -> None:
        tmp = f"{self.path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w") as f:
            json.dump({"at": self._at, "need": self._uses, "streamed": sorted(self._streamed)}, f)
        os.replace(tmp, self.path)


def needs(cache_dir: str) -> set[str]:
    """The basenames of the files that a live ledger of ``cache_dir`` still claims (read later
    in its pass, or being read). The ledgers (and leftovers) of processes that are gone are
    removed."""
    return {name for claims in _live(cache_dir) for name in claims["need"]}


def streamed(cache_dir: str) -> set[str]:
    """The basenames of the files that a live reader of ``cache_dir`` reads by ranged requests
    this pass (see :meth:`Ledger.stream`)."""
    return {name for claims in _live(cache_dir) for name in claims.get("streamed", ())}


def readers(cache_dir: str) -> int:
    """How many live readers of ``cache_dir`` have a ledger."""
    return sum(1 for _ in _live(cache_dir))


def note_evicted(cache_dir: str, names: list[str], epoch: int) -> None:
    """Record that the files ``names`` were evicted during ``epoch`` (under :func:`space_lock`):
    a reader of that epoch that starts after the eviction (a rank or worker that starts late,
    whose claims came too late to keep them) reads them by ranges rather than download them a
    second time this epoch (:func:`evicted`). Evictions of epochs before the previous are
    forgotten."""
    gone = {name: e for name, e in _evictions(cache_dir).items() if e >= epoch - 1}
    gone.update(dict.fromkeys(names, epoch))
    tmp = os.path.join(cache_dir, f"{_EVICTED}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(gone, f)
    os.replace(tmp, os.path.join(cache_dir, _EVICTED))


def evicted(cache_dir: str, epoch: int) -> set[str]:
    """The basenames of the files evicted during ``epoch`` (see :func:`note_evicted`)."""
    return {name for name, e in _evictions(cache_dir).items() if e == epoch}


def forget_evictions(cache_dir: str) -> None:
    """Forget every eviction recorded (a reader that starts with no other live reader: those
    records are of a run or an epoch that is over)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(cache_dir, _EVICTED))


def _evictions(cache_dir: str) -> dict[str, int]:
    try:
        with open(os.path.join(cache_dir, _EVICTED)) as f:
            gone = json.load(f)
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(gone, dict):
        return {}
    return {k: v for k, v in gone.items() if isinstance(v, int)}


def _live(cache_dir: str) -> Iterator[dict[str, Any]]:
    """The claims of the live ledgers of ``cache_dir``; dead ones are removed."""
    with os.scandir(cache_dir) as it:  # .wds-need-<pid>-<id>.{lock,json} (and .json.*.tmp)
        stems = {e.name.split(".")[1] for e in it if e.name.startswith(LEDGER_PREFIX)}
    for stem in stems:
        path, lock = (os.path.join(cache_dir, f".{stem}.{ext}") for ext in ("json", "lock"))
        if not held_by_another(lock):
            _remove_dead(path, lock)
            continue
        try:
            with open(path) as f:
                claims = json.load(f)
        except FileNotFoundError:  # not written yet, or released meanwhile
            continue
        except ValueError:  # not JSON (cut short, or not written by a ledger)
            claims = None
        if not _well_formed(claims):
            logger.warning(
                "shard cache: %s is not a reader's claims (a JSON object with 'need'): "
                "ignored, it claims no file",
                path,
            )
            continue
        yield claims


def _well_formed(claims: Any) -> bool:
    """Whether ``claims`` has the form :meth:`Ledger._write` gives them."""
    return (
        isinstance(claims, dict)
        and isinstance(claims.get("need"), dict)
        and isinstance(claims.get("streamed", []), list)
    )


def _remove_dead(path: str, lock: str) -> None:
    for gone in (path, lock):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(gone)
    logger.debug("removed %s: its process is gone", path)


def note_usage(cache_dir: str, used: int) -> None:
    """Record ``used`` bytes as the folder's peak if it is higher (under :func:`space_lock`)."""
    if used > cache_usage(cache_dir)["peak"]:
        tmp = os.path.join(cache_dir, f"{_USAGE}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "w") as f:
            json.dump({"peak": used}, f)
        os.replace(tmp, os.path.join(cache_dir, _USAGE))


def cache_usage(cache_dir: str) -> dict[str, int]:
    """``{"peak": bytes}``: the most the cache folder held (cached files and downloads under
    way) since it was created."""
    try:
        with open(os.path.join(cache_dir, _USAGE)) as f:
            return {"peak": int(json.load(f)["peak"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return {"peak": 0}
