"""Which client reads the files under a remote root: the transport that
:func:`~wdsloader.io.obstore_files.transport_for` picks, in the process that reads.

An fsspec filesystem (s3fs, HTTP, GCS ...), :class:`~wdsloader.io.obstore_files.ObstoreFiles`
where obstore may start in this process, or
:class:`~wdsloader.io.obstore_helper.HelperFiles` for the few reads (manifest, listing,
indexes) of a main process that may still fork workers (see :mod:`wdsloader.io.obstore_files`
on obstore and fork)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from wdsloader.io.obstore_files import (
    ObstoreFiles,
    started_elsewhere,
    started_here,
    transport_for,
)
from wdsloader.io.obstore_helper import HelperFiles
from wdsloader.io.storage import url_to_fs

__all__ = ["remote_filesystem"]

logger = logging.getLogger(__name__)


def remote_filesystem(
    root: str,
    options: Any,
    *,
    max_connections: int | None = None,
    data: bool = True,
) -> tuple[Any, str, bool]:
    """``(filesystem, base path, final)`` that reads the files under ``root`` with ``options``
    (a :class:`~wdsloader.io.options.ReadOptions`): the transport :func:`transport_for` picks,
    its client's own retries off (the caller retries under the deadline), its timeouts set.

    ``data``: the reads are shards' bytes. Other reads (indexes, listings, side files) of a
    process that may still fork workers go through obstore in a forked helper process
    (:class:`~wdsloader.io.obstore_helper.HelperFiles`) while obstore has not started here:
    ``final`` is then False, and the caller asks again with ``data=True`` for shard bytes."""
    if transport_for(root, options.transport, options.storage_options) == "obstore":
        if started_elsewhere():
            logger.log(
                logging.WARNING if options.transport == "obstore" else logging.INFO,
                "transport=%r: this process was forked after obstore ran in its parent "
                "(obstore's runtime does not survive a fork): reading through fsspec instead "
                "(workers started by 'spawn' or 'forkserver' read through obstore)",
                options.transport,
            )
        elif data or started_here() or _in_worker():
            return ObstoreFiles(root, options), "", True
        else:  # obstore in a forked helper: none started here, no s3fs set up
            return HelperFiles(root, options), "", False
    return (*_fsspec(root, options, max_connections), True)


def _fsspec(root: str, options: Any, max_connections: int | None) -> tuple[Any, str]:
    return url_to_fs(
        root,
        options.storage_options,
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
        client_retries=False,
        max_connections=max_connections,
    )


def _in_worker() -> bool:
    """Whether this process is a DataLoader worker (it forks no workers of its own)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None
