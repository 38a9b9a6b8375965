"""A local folder of whole copies of remote shard files, shared by processes, with LRU eviction.

Cached files are named by a hash of the full URL (with the shard's size and checksum), so equal
basenames from different roots never collide. Files appear only complete, so processes may share
the folder; a file evicted by another process is downloaded again. A download holds a lock per
file (``flock`` on a ``.wds-lock-*`` file, released by the kernel if the process dies, removed
once the download is over): the workers and ranks of a node that share the folder download each
shard once, the others wait for it and read the copy.

With a size limit, room is taken under one node-wide lock (:func:`~wdsloader.io.cache_ledger.
space_lock`): a download reserves its full size (its temporary file is sized at once) and is
renamed to its cache name under that lock too, so the files in the folder never add up to more
than the limit. To make room, only files that no live
reader of the node still reads this pass (:func:`~wdsloader.io.cache_ledger.needs`) are
evicted, least recently used first, never the files of the read under way. When no room can be
made, :meth:`ShardCache.ensure` says so and the store reads those ranges remotely instead: a
shard is downloaded at most once per pass, and a byte read remotely costs no more than a
download of it would. A process that is reading an evicted file keeps
its descriptor: the bytes stay valid until it closes it (POSIX unlink-while-open).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import posixpath
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator

from wdsloader.format import ShardInfo
from wdsloader.io.cache_ledger import (
    held_by_another,
    needs,
    note_evicted,
    note_usage,
    space_lock,
)

logger = logging.getLogger(__name__)

_CACHE_NAME = re.compile(r"^wds-[0-9a-f]{24}-")
_TMP_PREFIX = ".wds-tmp-"
_LOCK_PREFIX = ".wds-lock-"  # never evicted: a lock file names no cached file
_HASH_CHUNK = 8 << 20


class OpenFiles:
    """Read-only descriptors of local files by path; beyond ``limit`` the least recently used
    are closed, except those of ``pinned`` (the files of a read whose descriptors are being
    collected: they stay open until it is over, above the limit if need be)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.pinned: Collection[str] = ()

    def get(self, path: str) -> int | None:
        """The descriptor held for ``path`` (now the most recently used), or None."""
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
        return fd

    def __getitem__(self, path: str) -> int:
        return self._fds[path]

    def put(self, path: str, fd: int) -> None:
        """Hold ``fd`` for ``path``, closing any descriptor held for it before."""
        self.forget(path)
        self._fds[path] = fd
        self.trim(keep=path)

    def trim(self, keep: str | None = None) -> None:
        """Close the least recently used descriptors beyond ``limit``, but those of
        :attr:`pinned` and ``keep``."""
        excess = len(self._fds) - self.limit
        if excess > 0:
            free = [p for p in self._fds if p not in self.pinned and p != keep][:excess]
            for old in free:
                close_quietly(self._fds.pop(old))

    def forget(self, path: str) -> None:
        """Close the descriptor held for ``path``, if any."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            close_quietly(fd)

    def close_all(self) -> None:
        """Close every descriptor held."""
        while self._fds:
            close_quietly(self._fds.popitem()[1])


class ShardCache:
    """Whole copies of remote files in ``cache_dir``, at most ``limit_bytes`` in all (None: no
    limit).

    Descriptors on cached files are held in ``files``; ``count(name, n)`` receives the
    ``cache_hits``, ``cache_misses`` and ``evictions`` counters. Downloads call ``fill`` to write
    the whole of each shard into its (temporary) file descriptor, then ``check(shard, path, fd)``,
    which may reject a downloaded file by raising.
    """

    def __init__(
        self,
        cache_dir: str,
        limit_bytes: int | None,
        *,
        files: OpenFiles,
        count: Callable[[str, int], None],
        fill: Callable[[list[tuple[ShardInfo, int]]], None],
        check: Callable[[ShardInfo, str, int], None],
    ) -> None:
        self.cache_dir = cache_dir
        self.limit_bytes = limit_bytes
        self._files = files
        self._count = count
        self._fill = fill
        self._check = check
        self.epoch: int | None = None  # of the pass under way, if announced: see _reserve

    def path(self, url: str, shard: ShardInfo) -> str:
        """Cache path of the file at ``url`` (``shard`` itself or its index)."""
        key = f"{url}\0{shard.num_bytes}\0{shard.sha256 or ''}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        return os.path.join(self.cache_dir, f"wds-{digest}-{posixpath.basename(url)}")

    # -- small files read whole (indexes) ---------------------------------------------------------
    def read(self, cpath: str) -> bytes | None:
        """The content of a cached file, marked recently used, or None if it is not cached."""
        try:
            with open(cpath, "rb") as f:
                data = f.read()
            os.utime(cpath)
        except FileNotFoundError:
            return None
        return data

    def write(self, cpath: str, data: bytes) -> None:
        """Put ``data`` in the cache as ``cpath``, evicting files if needed (not cached when
        no room can be made)."""
        reserved = self._reserve([len(data)], set())
        if reserved is None:
            return
        ((fd, tmp),) = reserved
        try:
            pwrite_all(fd, data, 0)
            self._rename(tmp, cpath)
        finally:
            os.close(fd)
            unlink_quietly(tmp)

    # -- shards read through descriptors ----------------------------------------------------------
    def ensure(self, shards: list[ShardInfo], paths: dict[str, str], pinned: set[str]) -> bool:
        """Hold descriptors on the cached copies (``paths[shard.path]``) of ``shards``,
        downloading those not cached; files in ``pinned`` are not evicted. False (nothing
        downloaded) when the limit leaves no room for the missing ones."""
        missing = [s for s in shards if not self.lookup(paths[s.path], s.num_bytes)]
        if missing:  # one download per file for every process: lock, then look again
            with self._locked(sorted({paths[s.path] for s in missing})):
                missing = [s for s in missing if not self.lookup(paths[s.path], s.num_bytes)]
                if missing and not self.download([(s, paths[s.path]) for s in missing], pinned):
                    return False
        self._count("cache_hits", len(shards) - len(missing))
        return True

    @contextlib.contextmanager
    def _locked(self, cpaths: list[str]) -> Iterator[None]:
        """Hold the download locks of ``cpaths`` (taken in sorted order: no deadlock between
        processes that lock several), waiting for another process's download to end."""
        os.makedirs(self.cache_dir, exist_ok=True)
        held: list[tuple[str, int]] = []
        try:
            for cpath in cpaths:
                lock = os.path.join(self.cache_dir, _LOCK_PREFIX + os.path.basename(cpath))
                held.append((lock, _lock_file(lock)))
            yield
        finally:
            for lock, fd in held:  # removed while held: a waiter then locks a new file
                unlink_quietly(lock)
                close_quietly(fd)  # closing releases the lock

    def lookup(self, cpath: str, size: int | None = None) -> bool:
        """Whether a complete copy is cached (of ``size`` bytes, when given); if so, its
        descriptor is held and it is marked recently used. A copy of another size (cut short
        outside this cache: a full disk, a partial copy of the folder) is removed."""
        try:
            os.utime(cpath)
            st = os.stat(cpath)
        except FileNotFoundError:  # never cached, or evicted by another process
            self._files.forget(cpath)
            return False
        if size is not None and st.st_size != size:
            logger.warning(
                "shard cache: %s has %d bytes, not the shard's %d: removed, downloaded again",
                cpath, st.st_size, size,
            )  # fmt: skip
            self.discard(cpath)
            return False
        fd = self._files.get(cpath)
        if fd is not None:
            held = os.fstat(fd)
            if (held.st_ino, held.st_dev) == (st.st_ino, st.st_dev):
                return True
            self._files.forget(cpath)  # replaced by another process: let the old inode go
        try:
            self._files.put(cpath, os.open(cpath, os.O_RDONLY))
        except FileNotFoundError:
            return False
        return True

    def download(self, items: list[tuple[ShardInfo, str]], pinned: set[str]) -> bool:
        """Download whole shards into their cache paths (``(shard, path)`` items) and hold
        descriptors on them; files in ``pinned`` are not evicted. False (nothing downloaded)
        when the limit leaves no room for them."""
        reserved = self._reserve([s.num_bytes for s, _ in items], pinned)
        if reserved is None:
            return False
        temps = [(s, cpath, fd, tmp) for (s, cpath), (fd, tmp) in zip(items, reserved, strict=True)]
        try:
            self._fill([(shard, fd) for shard, _, fd, _ in temps])
            while temps:
                shard, cpath, fd, tmp = temps[0]
                self._check(shard, cpath, fd)
                os.fsync(fd)
                self._rename(tmp, cpath)
                temps.pop(0)
                self._files.put(cpath, fd)
                self._count("cache_misses", 1)
        finally:
            for _, _, fd, tmp in temps:
                close_quietly(fd)
                unlink_quietly(tmp)
        return True

    def discard(self, cpath: str) -> None:
        """Remove a cached file (a corrupt copy), so the next use downloads it again."""
        self._files.forget(cpath)
        unlink_quietly(cpath)

    # -- room ------------------------------------------------------------------------------------
    def _rename(self, tmp: str, cpath: str) -> None:
        """Give a finished download its cache name, under the room lock when the cache is
        bounded: a scan that makes room (:meth:`_scan`) lists the folder and then reads each
        file's size, and a file renamed in between would be counted under neither name."""
        if self.limit_bytes is None:
            os.replace(tmp, cpath)
            return
        with space_lock(self.cache_dir):
            os.replace(tmp, cpath)

    def _reserve(self, sizes: list[int], pinned: set[str]) -> list[tuple[int, str]] | None:
        """Temporary files of ``sizes`` bytes (descriptor, path; sized and locked now, so they
        count towards the limit in every process), after evicting what must go; None when no
        room can be made without evicting ``pinned`` files."""
        if self.limit_bytes is None:
            return [self._temp_file(0) for _ in sizes]
        with space_lock(self.cache_dir):
            incoming = sum(sizes)
            total, candidates = self._scan(pinned)
            evict = self._victims(total + incoming - self.limit_bytes, candidates)
            if evict is None:
                return None
            for size, path in evict:
                self._evict(path, size)
            if evict and self.epoch is not None:  # not downloaded again this epoch
                note_evicted(self.cache_dir, [os.path.basename(p) for _, p in evict], self.epoch)
            note_usage(self.cache_dir, total + incoming - sum(size for size, _ in evict))
            return [self._temp_file(size) for size in sizes]

    def _scan(self, pinned: set[str]) -> tuple[int, list[tuple[int, int, str]]]:
        """Bytes in the folder (downloads under way at their full size) and the cached files
        that may go, as ``(mtime, size, path)``; temporary files of dead processes removed.
        Called under the room lock, which every reservation and rename holds: only removals
        can happen meanwhile, and a file removed during the scan is at most counted."""
        total = 0
        candidates: list[tuple[int, int, str]] = []
        with os.scandir(self.cache_dir) as it:
            for entry in it:
                ours, temp = _CACHE_NAME.match(entry.name), entry.name.startswith(_TMP_PREFIX)
                if not (ours or temp):
                    continue  # never touch files that are not ours
                if temp and not held_by_another(entry.path):  # left by a crashed process
                    unlink_quietly(entry.path)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += st.st_size
                if ours and entry.path not in pinned:
                    candidates.append((st.st_mtime_ns, st.st_size, entry.path))
        return total, candidates

    def _victims(
        self, excess: int, candidates: list[tuple[int, int, str]]
    ) -> list[tuple[int, str]] | None:
        """The files to evict to free ``excess`` bytes, as ``(size, path)``, least recently
        used first, among those no live reader of the node still reads this pass; None when
        they would not free enough. A file still needed is never evicted: a download then
        would be a second one of it, where reading the ranges remotely costs no byte more."""
        if excess <= 0:
            return []
        needed = needs(self.cache_dir)
        out: list[tuple[int, str]] = []
        for _, size, path in sorted(candidates):
            if excess <= 0:
                break
            if os.path.basename(path) not in needed:
                out.append((size, path))
                excess -= size
        return out if excess <= 0 else None

    def _evict(self, path: str, size: int) -> None:
        self._files.forget(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return  # another process evicted it first
        self._count("evictions", 1)
        logger.debug("evicted %s (%d bytes) from the shard cache", path, size)

    def _temp_file(self, size: int) -> tuple[int, str]:
        """A new temporary file of ``size`` bytes (sparse), ``flock``-ed while this process
        holds it (a file nobody holds is a crashed download's)."""
        os.makedirs(self.cache_dir, exist_ok=True)
        name = f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:16]}"
        tmp = os.path.join(self.cache_dir, name)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, size)
        return fd, tmp


def _lock_file(path: str) -> int:
    """A descriptor holding an exclusive ``flock`` on the file at ``path`` (created if needed),
    waiting for the process holding it; the file is still the one at ``path`` (a holder
    removes it when done)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            now = os.stat(path)
        except FileNotFoundError:  # removed by the holder we waited for: lock a new one
            close_quietly(fd)
            continue
        except BaseException:
            close_quietly(fd)
            raise
        if (held.st_ino, held.st_dev) == (now.st_ino, now.st_dev):
            return fd
        close_quietly(fd)  # replaced meanwhile: lock the file there now


def hash_fd(fd: int) -> str:
    """Hex sha256 of the whole file open as ``fd``."""
    sha = hashlib.sha256()
    pos = 0
    while chunk := os.pread(fd, _HASH_CHUNK, pos):
        sha.update(chunk)
        pos += len(chunk)
    return sha.hexdigest()


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def close_quietly(fd: int) -> None:
    """Close ``fd``, ignoring errors."""
    try:
        os.close(fd)
    except OSError:
        pass


def unlink_quietly(path: str) -> None:
    """Remove ``path`` if it exists."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
