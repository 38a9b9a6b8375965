"""fsspec glue: one place that turns a path or URL into a filesystem and writes atomically.

Every filesystem made here for HTTP(S) or S3 has bounded connect and read timeouts (see
:func:`with_timeouts`), unless the storage options set their own: a server that accepts a
connection and never answers raises an error instead of hanging.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem

from wdsloader.io import forksafe

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 20.0
_HTTP = ("http", "https")
_S3 = ("s3", "s3a")


def url_to_fs(
    url: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    client_retries: bool = True,
    max_connections: int | None = None,
) -> tuple[Any, str]:
    """``(filesystem, path)`` for a local path or any fsspec URL, with the timeouts, client
    retries and connection pool of :func:`with_timeouts` (HTTP(S) and S3)."""
    forksafe.install()
    text = os.fspath(url)
    options = with_timeouts(
        text,
        storage_options,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        client_retries=client_retries,
        max_connections=max_connections,
    )
    fs, path = fsspec.core.url_to_fs(text, **options)
    if not client_retries and split_protocol(text)[0] in _S3 and hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own retry loop (a private instance: skip_instance_cache)
    return fs, path.rstrip("/") or path


def with_timeouts(
    url: str,
    storage_options: dict[str, Any] | None,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    client_retries: bool = True,
    max_connections: int | None = None,
) -> dict[str, Any]:
    """A copy of ``storage_options`` with connect and read timeouts for ``url``'s filesystem.

    ``connect_timeout`` bounds opening a connection, ``read_timeout`` the wait for any bytes of
    an answer (seconds). HTTP(S): an aiohttp ``ClientTimeout(sock_connect, sock_read)`` as
    ``client_kwargs["timeout"]`` (no total: a long download that keeps receiving is fine).
    S3 (s3fs): ``config_kwargs`` ``connect_timeout``/``read_timeout``. A timeout the options set
    themselves wins. ``client_retries=False`` turns off the client's own retries (botocore's
    attempts and s3fs's retry loop) for a caller that retries itself under a deadline.
    ``max_connections`` sizes the S3 client's connection pool (botocore's
    ``max_pool_connections``, 10 by default), so that as many requests can be in flight (HTTP:
    aiohttp's pool holds 100). Other protocols are returned unchanged.
    """
    options = dict(storage_options or {})
    protocol = split_protocol(url)[0]
    if protocol in _HTTP:
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
        )
        options["client_kwargs"] = client
    elif protocol in _S3:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", connect_timeout)
        config.setdefault("read_timeout", read_timeout)
        if max_connections is not None:
            config.setdefault("max_pool_connections", max_connections)
        if not client_retries:
            config.setdefault("retries", {"total_max_attempts": 1})
            options["skip_instance_cache"] = True  # fs.retries is set on this instance
        options["config_kwargs"] = config
    return options


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
