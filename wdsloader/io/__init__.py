"""Bytes in and out: fsspec glue, ranged shard reads with retries and timeouts, and the shard cache.

Names are imported on first use, so the manifest's reading and writing
(:mod:`wdsloader.io.manifest_io`, which ``import wdsloader`` imports) does not import the shard
reader.
"""

# ruff: noqa: F401 - the TYPE_CHECKING imports name what __all__ (from _EXPORTS) lists
from __future__ import annotations

from typing import TYPE_CHECKING

from wdsloader.lazy import lazy_exports

_EXPORTS = {
    "ReadOptions": "wdsloader.io.fetch",
    "ShardStore": "wdsloader.io.fetch",
    "ShardCache": "wdsloader.io.shard_cache",
    "Store": "wdsloader.io.store",
    "open_store": "wdsloader.io.store",
    "is_local": "wdsloader.io.storage",
    "join": "wdsloader.io.storage",
    "load_manifest": "wdsloader.io.manifest_io",
    "parse_storage_options": "wdsloader.io.storage",
    "save_manifest": "wdsloader.io.manifest_io",
    "url_to_fs": "wdsloader.io.storage",
    "with_timeouts": "wdsloader.io.storage",
    "write_atomic": "wdsloader.io.storage",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.io.fetch import ReadOptions, ShardStore
    from wdsloader.io.manifest_io import load_manifest, save_manifest
    from wdsloader.io.shard_cache import ShardCache
    from wdsloader.io.storage import (
        is_local,
        join,
        parse_storage_options,
        url_to_fs,
        with_timeouts,
        write_atomic,
    )
    from wdsloader.io.store import Store, open_store
