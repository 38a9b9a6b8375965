"""How a :class:`~wdsloader.io.fetch.ShardStore` reads: retries, timeouts, concurrency, cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from wdsloader.io.storage import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, with_timeouts
from wdsloader.redact import redact_options


@dataclass(slots=True, kw_only=True)
class ReadOptions:
    """How a :class:`~wdsloader.io.fetch.ShardStore` reads.

    ``retries`` per request on transient errors (dropped or reset connections, timeouts, HTTP
    5xx/408/429, aiohttp payload errors, other ``OSError``; never on missing files, denied access
    or other client errors), after ``backoff`` seconds doubled each time, capped at 2 s.
    Remote reads are tuned from the path, measured on the first requests (round trip and one
    connection's throughput; :func:`wdsloader.io.tuning.tune`): ``max_request_bytes`` per
    ranged request (8-16 MiB), ``concurrency`` requests in flight (4-64; threads serve them,
    the S3 client's connection pool is sized to the most) and ``readahead_bytes`` read ahead
    of the batches being decoded (32-256 MiB), each reading process taking its share of the
    node (its ranks, from ``LOCAL_WORLD_SIZE``, times their workers). None (the default) means
    derived; a value set here wins. Derived, the read-ahead holds at least two shuffle windows
    where memory allows (at most 256 MiB, and a node's readers together at most 1/8 of its
    memory: :func:`wdsloader.io.tuning.ahead_budget`), so that the next window's requests are
    queued while the current one's last answers arrive. Peak memory of a reading process
    (each DataLoader worker) is bounded by the group of batches being decoded (one shuffle
    window) plus the read-ahead (plus one group when a single group is larger than the
    budget: at least one group is read ahead).
    ``cache_dir`` keeps whole remote shards and indexes; the ranks and workers of a node that
    share it download each shard once (a per-file ``flock``). ``cache_limit_bytes`` caps the
    folder at every moment, downloads under way included (a ValueError without ``cache_dir``):
    room is made by evicting, least recently used first, only shards no reader of the node
    still reads this epoch (each reader keeps a small ledger in the folder); a shard that finds
    no room is read by ranged requests for the rest of that reader's pass (never downloaded
    twice). A shard larger than the limit raises ValueError naming it at its first read. Locks
    and ledgers of a killed process are released by the kernel or removed when found (see
    ``docs/loading.md``, "Remote datasets and the shard cache"). ``verify_checksum`` checks a
    shard's sha256 when it is first downloaded into the cache or first opened.

    Timeouts (seconds) bound a server that accepts a connection and never answers:
    ``connect_timeout`` for opening a connection, ``read_timeout`` for the wait for any bytes of
    an answer (HTTP(S): aiohttp's ``sock_connect``/``sock_read``; S3: botocore's
    ``connect_timeout``/``read_timeout``; a timeout set in ``storage_options`` wins), and
    ``deadline`` for one request with all its retries: an attempt still running at the
    deadline is cancelled (filesystems with an async API: HTTP(S), S3, GCS ...) and no retry
    starts after it; None means no deadline. The client libraries' own retries are turned off:
    ``retries`` counts them all. Then :class:`ShardReadError` names the file and the URL
    (credentials redacted). With the defaults a dead server is reported after about a minute.

    ``transport`` is the client of remote reads: ``"auto"`` (the default: obstore for
    ``s3://`` when it is installed, every option maps and the bucket's region or an endpoint is
    known, else fsspec, silently), ``"fsspec"`` (s3fs, HTTP, GCS ...) or ``"obstore"`` (S3
    through the ``obstore`` package, ``pip install 'wdsloader[s3fast]'``, the same URL and
    ``storage_options``; a ValueError says why when it cannot serve the root or an option).
    obstore starts in the processes that read shards (each DataLoader worker, or the main
    process at ``num_workers=0``; see :mod:`wdsloader.io.obstore_files`).
    """

    storage_options: dict[str, Any] | None = None
    retries: int = 5
    backoff: float = 0.05
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    deadline: float | None = 60.0
    max_request_bytes: int | None = None
    concurrency: int | None = None
    readahead_bytes: int | None = None
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    verify_checksum: bool = False
    max_open_files: int = 64
    transport: str = "auto"

    def __post_init__(self) -> None:
        if self.transport not in ("auto", "fsspec", "obstore"):
            raise ValueError(
                f"transport={self.transport!r}: expected 'auto', 'fsspec' or 'obstore'"
            )
        if self.retries < 0 or self.backoff < 0 or (self.cache_limit_bytes or 0) < 0:
            raise ValueError("retries, backoff and cache_limit_bytes must be >= 0")
        tuned = (self.max_request_bytes, self.concurrency, self.readahead_bytes)
        if min([v for v in tuned if v is not None] + [self.max_open_files]) < 1:
            raise ValueError(
                "max_request_bytes, concurrency, readahead_bytes and max_open_files must be >= 1"
            )
        if not (self.connect_timeout > 0 and self.read_timeout > 0) or (
            self.deadline is not None and not self.deadline > 0
        ):
            raise ValueError("connect_timeout, read_timeout and deadline must be > 0")
        if self.cache_limit_bytes is not None and self.cache_dir is None:
            raise ValueError(
                f"cache_limit_bytes={self.cache_limit_bytes} needs a cache_dir (it limits the cache)"
            )

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["storage_options"] = redact_options(self.storage_options)  # no credentials
        return f"ReadOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def storage_options_for(self, url: str) -> dict[str, Any]:
        """``storage_options`` with these connect and read timeouts for ``url``'s filesystem
        (for other readers of the same dataset, e.g. its manifest)."""
        return with_timeouts(
            url,
            self.storage_options,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
        )
