"""Bytes in and out: fsspec glue, ranged shard reads with retries and timeouts, and the shard cache.

Names are imported on first use: :mod:`wdsloader.format` reads manifests through
:mod:`wdsloader.io.storage` while :mod:`wdsloader.io.fetch` reads the format's shard records, so an
eager import here would be circular.
"""

# ruff: noqa: F401 - the TYPE_CHECKING imports name what __all__ (from _EXPORTS) lists
from __future__ import annotations

from typing import TYPE_CHECKING

from wdsloader.lazy import lazy_exports

_EXPORTS = {
    "ReadOptions": "wdsloader.io.fetch",
    "ShardStore": "wdsloader.io.fetch",
    "ShardCache": "wdsloader.io.shard_cache",
    "is_local": "wdsloader.io.storage",
    "join": "wdsloader.io.storage",
    "parse_storage_options": "wdsloader.io.storage",
    "url_to_fs": "wdsloader.io.storage",
    "with_timeouts": "wdsloader.io.storage",
    "write_atomic": "wdsloader.io.storage",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from wdsloader.io.fetch import ReadOptions, ShardStore
    from wdsloader.io.shard_cache import ShardCache
    from wdsloader.io.storage import (
        is_local,
        join,
        parse_storage_options,
        url_to_fs,
        with_timeouts,
        write_atomic,
    )
