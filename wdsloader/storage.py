"""fsspec glue: one place that turns a path or URL into a filesystem and writes atomically."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


def url_to_fs(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
    """``(filesystem, path)`` for a local path or any fsspec URL."""
    fs, path = fsspec.core.url_to_fs(os.fspath(url), **(storage_options or {}))
    return fs, path.rstrip("/") or path


def join(base: str, *parts: str) -> str:
    """Join path components with ``/`` (fsspec paths are POSIX-style on every filesystem)."""
    return posixpath.join(base, *parts)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local filesystem (where ``open``/``os.pread`` work on the path)."""
    return isinstance(fs, LocalFileSystem)


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` so that ``path`` appears complete or not at all.

    Local files go through a temporary name in the same folder and ``os.replace``; object stores
    (S3, GCS, memory) make a single PUT visible atomically.
    """
    parent = posixpath.dirname(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    if is_local(fs):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    else:
        fs.pipe_file(path, data)


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """fsspec options from command-line ``KEY=VALUE`` pairs.

    Dotted keys nest (``client_kwargs.endpoint_url=...``); values are JSON when they parse as
    JSON (``true``, ``3``), else strings. A malformed pair is a ValueError naming it.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"invalid --storage-option {pair!r}: use KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"invalid --storage-option {pair!r}: {p!r} is already a value")
        node[leaf] = value
    return out
