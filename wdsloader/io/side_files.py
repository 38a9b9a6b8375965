"""A shard's side files read through its :class:`~wdsloader.io.store.Store` (so with the
store's retries, deadline and cache): the key index (``.X.tar.wdskeys``) and the lengths
(``.X.tar.wdslen``). The bytes are parsed by the pure readers of :mod:`wdsloader.format`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from wdsloader.errors import ShardFormatError
from wdsloader.format import ShardInfo
from wdsloader.format.keyindex import KEY_RECORD, decode_key_index
from wdsloader.format.lengths import (
    LENGTH_DTYPE,
    declared_lengths_path,
    missing_lengths,
    shard_lengths,
)
from wdsloader.io.store import Store

__all__ = ["read_key_index", "read_lengths", "read_split_lengths"]


def read_key_index(store: Store, shard: ShardInfo) -> np.ndarray:
    """The checked key-index records of ``shard`` (its manifest must list ``keys_path``); a
    ShardFormatError naming the file when it is absent or of the wrong size."""
    rel = shard.keys_path
    if rel is None:
        raise ShardFormatError(f"{store.url(shard)}: no key index in the manifest")
    url = store.url(shard).removesuffix(shard.path) + rel
    size = shard.num_samples * KEY_RECORD.itemsize
    try:
        data = store.read_side_file(shard, rel, size)
    except FileNotFoundError:
        raise ShardFormatError(f"{url}: key index file not found") from None
    return decode_key_index(_not_longer(data, size, url), shard.num_samples, source=url)


def read_lengths(store: Store, shard: ShardInfo) -> npt.NDArray[np.uint32]:
    """The lengths of ``shard``'s samples (see :mod:`wdsloader.format.lengths`); a
    ShardFormatError naming the shard when it has none, or its file is missing or of the wrong
    size."""
    rel = declared_lengths_path(shard)
    size = shard.num_samples * LENGTH_DTYPE.itemsize
    try:
        data = store.read_side_file(shard, rel, size)
    except FileNotFoundError:
        raise missing_lengths(shard) from None
    return shard_lengths(_not_longer(data, size, f"shard {shard.path}: lengths {rel}"), shard)


def _not_longer(data: bytes, size: int, source: str) -> bytes:
    """``data`` (read with one byte past the ``size`` the manifest gives), or a ShardFormatError
    when the file is longer."""
    if len(data) > size:
        raise ShardFormatError(
            f"{source}: more than {size} bytes, expected {size} (one record per sample)"
        )
    return data


def read_split_lengths(store: Store, shards: Sequence[ShardInfo]) -> npt.NDArray[np.uint32]:
    """The lengths of a split's samples indexed by global sample id (the shards' lengths
    concatenated in manifest order), as a plan reads them."""
    parts = [read_lengths(store, shard) for shard in shards]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)
