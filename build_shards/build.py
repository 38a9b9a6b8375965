"""``build_shards``: source -> split -> encode -> shards + idx -> manifest (stub, being written)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from wdsloader.format import FieldSpec, Manifest


def build_shards(
    source: Any,
    output: str | os.PathLike[str],
    *,
    splits: Mapping[str, float] | None = None,
    split_field: str | None = None,
    group_by: str | None = None,
    key_field: str = "__key__",
    schema: Mapping[str, FieldSpec | Mapping[str, Any]] | None = None,
    dims: Mapping[str, int] | None = None,
    map: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    shard_max_count: int = 10_000,
    shard_max_bytes: int = 256 * 2**20,
    block_size: int | None = None,
    workers: int = 1,
    seed: int = 0,
    allow_nan: bool = False,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    loader_defaults: Mapping[str, Any] | None = None,
    progress: bool | Callable[[int, int], None] = False,
) -> Manifest:
    raise NotImplementedError
