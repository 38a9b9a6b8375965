"""The storage seam: what the batch reader asks of the shards' storage, and which implementation
serves a dataset root.

:class:`Store` is the protocol the read side uses (indexes, side files, byte ranges into
buffers, URLs for messages, redaction, close). Its implementations: :class:`~wdsloader.io.file_store.LocalStore`
(a local folder, read with ``pread``), :class:`~wdsloader.io.file_store.CachedStore` (a remote
root whose shards are downloaded whole into ``cache_dir``, then read locally),
:class:`~wdsloader.io.remote_store.RemoteStore` (ranged requests to any fsspec URL) and
:class:`~wdsloader.mix.store.MixStore` (the shards of several datasets, each through its own
store).

:data:`STORES` is the one place that names them: :func:`store_kind` says which kind a root and
its :class:`~wdsloader.io.options.ReadOptions` take, :func:`open_store` builds it. A new backend
registers its class under a new kind with :func:`register_store` (by dotted path, imported on
first use) and is chosen where :func:`store_kind` picks it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from fsspec.core import split_protocol

from wdsloader.format import ShardInfo
from wdsloader.io.options import ReadOptions
from wdsloader.io.ranges import Cut, Request

if TYPE_CHECKING:
    from wdsloader.io.fetch import ShardStore

__all__ = ["STORES", "Store", "open_store", "register_store", "store_class", "store_kind"]

LOCAL_PROTOCOLS = (None, "file", "local")

# kind -> "module:Class" of its implementation (imported on first use)
STORES: dict[str, str] = {
    "local": "wdsloader.io.file_store:LocalStore",
    "cached": "wdsloader.io.file_store:CachedStore",
    "remote": "wdsloader.io.remote_store:RemoteStore",
}


@runtime_checkable
class Store(Protocol):
    """The shards' storage as the batch reader uses it.

    ``shard`` arguments are the :class:`ShardInfo` objects of the split being read; a request is
    ``(shard, start, stop)``, a byte range of the shard's file.
    """

    @property
    def reads_locally(self) -> bool:
        """True when ranges are read from local files (a small random read costs little);
        False when each range is a remote request."""
        ...

    def url(self, shard: ShardInfo) -> str:
        """Full path or URL of a shard, for messages (credentials redacted)."""
        ...

    def redact(self, text: object) -> str:
        """``text`` with the store's credentials replaced by ``***``."""
        ...

    def index(self, shard: ShardInfo) -> np.ndarray:
        """Sample start offsets of a shard, then its end offset (int64, read-only)."""
        ...

    def load_indexes(self, shards: Sequence[ShardInfo]) -> None:
        """Read the indexes of ``shards`` not read yet, concurrently (before :meth:`index`)."""
        ...

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """The whole of a small file beside ``shard`` (``rel``: its path under the root, e.g. the
        key index ``a/.X.tar.wdskeys``), read with the store's retries, deadline and cache.
        With ``size`` (known from the manifest) at most ``size + 1`` bytes are read, in one
        request: a longer file shows as one byte too many. FileNotFoundError if it is absent."""
        ...

    def read_ranges(self, requests: Sequence[Request]) -> list[bytes]:
        """The bytes of each request, in request order."""
        ...

    def read_joined(
        self,
        requests: Sequence[Request],
        out: np.ndarray | None = None,
        cuts: Sequence[Sequence[Cut]] | None = None,
    ) -> tuple[bytes | np.ndarray, list[int]]:
        """The requests' bytes back to back in one buffer (the start of ``out`` when it is
        large enough) and where each starts; ``cuts`` send bytes of a range to other buffers
        (see :meth:`wdsloader.io.fetch.ShardStore.read_joined`)."""
        ...

    def close(self) -> None:
        """Close open files, connections and threads; the store reopens them if used again."""
        ...


def store_kind(root: str, options: ReadOptions) -> str:
    """The kind of store (a key of :data:`STORES`) that reads ``root`` with ``options``: local
    paths and ``file://`` URLs ``"local"``; other URLs ``"cached"`` with a ``cache_dir``, else
    ``"remote"``."""
    if split_protocol(root)[0] in LOCAL_PROTOCOLS:
        return "local"
    return "cached" if options.cache_dir else "remote"


def store_class(root: str, options: ReadOptions) -> type[ShardStore]:
    """The implementation registered for the kind of ``root`` (see :func:`store_kind`)."""
    kind = store_kind(root, options)
    module, _, name = STORES[kind].partition(":")
    cls: type[ShardStore] = getattr(importlib.import_module(module), name)
    return cls


def register_store(kind: str, target: str) -> None:
    """Serve stores of ``kind`` with the class at ``target`` (``"package.module:Class"``, a
    subclass of :class:`~wdsloader.io.fetch.ShardStore`)."""
    if ":" not in target:
        raise ValueError(f"store {kind!r}: target {target!r} is not 'package.module:Class'")
    STORES[kind] = target


def open_store(root: str | os.PathLike[str], options: ReadOptions | None = None) -> ShardStore:
    """The store that reads the shards under ``root`` (no I/O until used)."""
    opts = options if options is not None else ReadOptions()
    return store_class(os.fspath(root), opts)(root, opts)
