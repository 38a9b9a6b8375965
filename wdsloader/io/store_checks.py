"""Checks of a :class:`~wdsloader.io.fetch.ShardStore`'s files: sha256 checksums (verified once
per file, or on request) and the start-up check that every shard and index exists with its size.

:class:`StoreChecks` is the part of ``ShardStore`` that does this job; it relies on the store's
state and reads, declared below.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import posixpath
import threading
from collections.abc import Sequence

from wdsloader.errors import ShardFormatError
from wdsloader.format import ShardInfo
from wdsloader.io.options import ReadOptions
from wdsloader.io.retry import RemoteFiles
from wdsloader.io.shard_cache import hash_fd
from wdsloader.io.tuning import Tuning

logger = logging.getLogger("wdsloader.io.fetch")  # the store's log: one name for its modules


class StoreChecks:
    """Checksum and presence checks of the shards under a store's root (``ShardStore`` mixes it
    in)."""

    # the store's state and reads (see ShardStore)
    options: ReadOptions
    _lock: threading.RLock
    _verified: set[str]

    def _ensure_process(self) -> None:
        raise NotImplementedError

    def url(self, shard: ShardInfo) -> str:
        raise NotImplementedError

    def _url(self, rel: str) -> str:
        raise NotImplementedError

    def _storage(self) -> RemoteFiles:
        raise NotImplementedError

    def tuning(self) -> Tuning:
        raise NotImplementedError

    def _fd(self, shard: ShardInfo, path: str, pinned: set[str]) -> int:
        raise NotImplementedError

    # where the implementations differ (remote files: the defaults)
    def _own_file(self, shard: ShardInfo) -> str | None:
        """The local path of the shard's own file (a local root), else None."""
        return None

    def _local_copy(self, shard: ShardInfo) -> str | None:
        """The local file that reads of the shard use (its own file, or its cached copy,
        downloaded now if needed), or None when reads are remote requests."""
        return None

    def _discard(self, path: str) -> None:
        """Forget a local copy found corrupt (a cached copy is removed)."""

    # -- checksums -------------------------------------------------------------------------------
    def verify(self, shard: ShardInfo) -> None:
        """Compare the sha256 of the whole shard file with ``shard.sha256``.

        Raises ShardFormatError naming the file on a mismatch (a corrupt cached copy is removed),
        ValueError if the manifest has no checksum for the shard.
        """
        self._ensure_process()
        if not shard.sha256:
            raise ValueError(f"{self.url(shard)}: the manifest has no sha256 for this shard")
        with self._lock:
            path = self._local_copy(shard)
            if path is None:
                self._check_digest(shard, self._hash_remote(shard))
                return
            self._verified.discard(path)
            self._verify_once(shard, path, force=True)

    def _verify_once(self, shard: ShardInfo, path: str, force: bool = False) -> None:
        """Check the local file (or cached copy) of a shard the first time it is used."""
        if path in self._verified or not (force or self.options.verify_checksum):
            return
        if shard.sha256:
            try:
                self._check_digest(shard, hash_fd(self._fd(shard, path, {path})))
            except ShardFormatError:
                self._discard(path)
                raise
        else:
            logger.warning("%s: no sha256 in the manifest, not verified", self.url(shard))
        self._verified.add(path)

    def _check_digest(self, shard: ShardInfo, digest: str | None) -> None:
        if digest is not None and shard.sha256 and digest != shard.sha256:
            raise ShardFormatError(
                f"{self.url(shard)}: sha256 mismatch (manifest {shard.sha256}, file {digest}): "
                "the shard is corrupt or was changed after the build"
            )

    def _hash_remote(self, shard: ShardInfo) -> str | None:
        if not shard.sha256:
            logger.warning("%s: no sha256 in the manifest, not verified", self.url(shard))
            return None
        return self._hash_ranges(shard)

    def _hash_ranges(self, shard: ShardInfo) -> str:
        sha = hashlib.sha256()
        step = self.tuning().request_bytes
        for start in range(0, shard.num_bytes, step):
            sha.update(self._storage().fetch(shard.path, start, min(start + step, shard.num_bytes)))
        return sha.hexdigest()

    def sha256(self, shard: ShardInfo) -> str:
        """Hex sha256 of the shard's file as stored: a local file read whole, a remote one by
        ranged reads (``shard.num_bytes`` of them) with the retries and deadline of reads; the
        shard cache is not used. Raises FileNotFoundError naming a missing file."""
        self._ensure_process()
        with self._lock:
            path = self._own_file(shard)
            if path is not None:
                return hash_fd(self._fd(shard, path, {path}))
            return self._hash_ranges(shard)

    # -- start-up check --------------------------------------------------------------------------
    def check_shards(self, shards: Sequence[ShardInfo]) -> None:
        """Check that every shard and index file exists, with the manifest's size where known.

        One listing per directory; files a listing does not show (plain HTTP servers may not
        list) are probed one by one. Raises FileNotFoundError naming the missing files,
        ShardFormatError naming a file whose size differs from the manifest.
        """
        self._ensure_process()
        with self._lock:  # the listings below leave the store free (indexes read meanwhile)
            remote = self._storage()
        groups: dict[str, list[tuple[str, int]]] = {}
        for s in shards:
            for rel, size in ((s.path, s.num_bytes), (s.idx_path, (s.num_samples + 1) * 8)):
                groups.setdefault(posixpath.dirname(rel), []).append((rel, size))
        missing: list[str] = []
        for folder, files in groups.items():
            listing = remote.list_dir(folder)
            for rel, expected in files:
                name = posixpath.basename(rel)
                if listing is not None and name in listing:
                    found = listing[name]
                else:
                    try:
                        found = self.file_size(rel)
                    except FileNotFoundError:
                        missing.append(self._url(rel))
                        continue
                if found is not None and found != expected:
                    raise ShardFormatError(
                        f"{self._url(rel)}: file has {found} bytes, the manifest says {expected}"
                    )
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise FileNotFoundError(
                errno.ENOENT, f"{len(missing)} shard file(s) missing: {shown}", missing[0]
            )

    def list_dir(self, folder: str = "") -> dict[str, int | None] | None:
        """``{basename: size or None}`` of the files in ``folder`` (relative to the root; ``""``
        is the root), or None when the storage does not list it (plain HTTP servers may not).
        Names are the files' names (an HTTP listing's URL quoting undone)."""
        self._ensure_process()
        with self._lock:
            return self._storage().list_dir(folder)

    def file_size(self, rel: str) -> int | None:
        """The size of the file ``rel`` under the root, or None when the storage does not say,
        with the retries and deadline of reads. Raises FileNotFoundError naming a missing file."""
        self._ensure_process()
        with self._lock:
            size = self._storage().info(rel).get("size")
        return None if size is None else int(size)
