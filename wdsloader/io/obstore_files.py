"""A second transport for remote reads: S3 through obstore (Rust ``object_store``), chosen by
:attr:`ReadOptions.transport <wdsloader.io.options.ReadOptions>`.

:func:`~wdsloader.io.remote_fs.remote_filesystem` returns what
:class:`~wdsloader.io.retry.RemoteFiles` reads from: an fsspec filesystem (s3fs, HTTP, GCS ...:
the ``"fsspec"`` transport) or, for ``s3://`` roots with the ``"obstore"`` transport (which
``"auto"``, the default, picks where it can: see :func:`transport_for`), an
:class:`ObstoreFiles`, the few filesystem calls the reads use (``cat_file``, ``info``, ``ls``)
served by an ``obstore.store.S3Store``. The user's interface stays the same: the URL and the
s3fs ``storage_options`` (``key``/``secret``/``token``, ``anon``, ``endpoint_url`` or
``client_kwargs.endpoint_url``, ``client_kwargs.region_name``, ``profile``, ``requester_pays``);
without keys, botocore's credential chain (environment, profiles, SSO, instance roles: what s3fs
would use) signs the requests.

Every attempt is ours: obstore's own retries are off (``max_retries=0``) and its errors become
the Python errors :mod:`wdsloader.io.transient` classifies (an HTTP status, with S3's error
code, for an answer; ``ConnectionRefusedError``, ``ConnectionResetError``, ``TimeoutError`` or
``ConnectionError`` for a network failure; ``FileNotFoundError`` for 404; ``PermissionError``
for 401/403; ``ssl.SSLCertVerificationError`` for a certificate refused). No credential is kept
in a repr, a message or the pickled state (the store is rebuilt in each process).

Fork: obstore 0.12's runtime does not survive a fork (a process forked after obstore made a
request in its parent hangs at its first request). obstore therefore starts only in a process
that reads shard bytes: a DataLoader worker (fork, spawn or forkserver: each starts its own) or
the main process at ``num_workers=0``. A main process that forks no workers (none, threads, or
workers started by ``spawn`` or ``forkserver``) reads its manifest, listing and indexes through
obstore too (no s3fs set up); one that forks them reads what it needs before they start (the
manifest, the listing, the indexes, side files) through obstore in a forked helper process
(:mod:`wdsloader.io.obstore_helper`: no runtime here, no s3fs set up). A process forked after
obstore made requests above it (workers of a loader made after a ``num_workers=0`` epoch in the
same process) reads through fsspec, with a warning (start its workers with ``spawn`` or
``forkserver`` to keep obstore there)."""

from __future__ import annotations

import asyncio
import datetime
import errno
import importlib.util
import logging
import os
import re
import ssl
import threading
from typing import Any

from fsspec.core import split_protocol

__all__ = [
    "TRANSPORTS",
    "ObjectStoreError",
    "ObstoreFiles",
    "obstore_config",
    "started_elsewhere",
    "started_here",
    "transport_for",
]

logger = logging.getLogger(__name__)

TRANSPORTS = ("auto", "fsspec", "obstore")
_started_in: int | None = None  # the process whose obstore made requests (None: none yet)
_S3 = ("s3", "s3a")
# s3fs options that change nothing for obstore (caching of fsspec objects, botocore's pool and
# retries: ours are set from ReadOptions)
_IGNORED = frozenset(
    "skip_instance_cache use_listings_cache listings_expiry_time max_paths default_block_size "
    "default_fill_cache default_cache_type cache_regions asynchronous loop".split()
)
_IGNORED_CONFIG = frozenset("connect_timeout read_timeout max_pool_connections retries".split())


class ObjectStoreError(Exception):
    """An answer of the object store that is not a success: ``status`` (HTTP) and ``code``
    (S3's error code, e.g. ``SlowDown``) decide whether it is retried; None when unknown."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def obstore_installed() -> bool:
    """Whether the ``obstore`` package can be imported."""
    return importlib.util.find_spec("obstore") is not None


def transport_for(root: str, transport: str, storage_options: dict[str, Any] | None) -> str:
    """The transport (``"fsspec"`` or ``"obstore"``) that reads ``root``.

    ``"auto"`` picks obstore for ``s3://`` roots when it is installed, every storage option
    maps onto it and the bucket's region is known (an endpoint or region in the options, the
    environment or the AWS config: obstore does not look a bucket's region up as s3fs does),
    else fsspec. ``"obstore"`` on a root or options it cannot serve is a ValueError saying why
    (not a silent fall back)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}: expected one of {', '.join(TRANSPORTS)}")
    if transport == "fsspec":
        return "fsspec"
    protocol = split_protocol(root)[0]
    why = None
    if protocol not in _S3:
        why = f"it reads s3:// roots only, not {protocol or 'local'}:// ones"
    elif not obstore_installed():
        why = "obstore is not installed (pip install 'wdsloader[s3fast]')"
    else:
        config, unsupported = obstore_config(storage_options)
        if unsupported:
            why = f"storage option(s) {', '.join(unsupported)} have no obstore equivalent"
        elif transport == "auto" and _region(config) is None and "endpoint" not in config:
            why = "the bucket's region is not configured"
    if why is None:
        return "obstore"
    if transport == "obstore":
        raise ValueError(f"transport='obstore' cannot read this dataset: {why}")
    return "fsspec"


def obstore_config(storage_options: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """``(S3Store keyword arguments, names of the options that do not map)`` for s3fs
    ``storage_options`` (values of secret options never appear in the names)."""
    opts = dict(storage_options or {})
    client = dict(opts.pop("client_kwargs", None) or {})
    config = dict(opts.pop("config_kwargs", None) or {})
    out: dict[str, Any] = {}
    unsupported: list[str] = []
    pairs = [("key", "access_key_id"), ("secret", "secret_access_key"), ("token", "session_token")]
    for name, target in pairs + [(f"aws_{t}", t) for _, t in pairs]:
        if opts.get(name) is not None:
            out[target] = str(opts.pop(name))
        opts.pop(name, None)
    if opts.pop("anon", False):
        out["skip_signature"] = True
    if opts.pop("requester_pays", False):
        out["request_payer"] = True
    profile = opts.pop("profile", None)
    if profile is not None:
        out["profile"] = str(profile)  # for the credential provider (not an S3Store argument)
    endpoint = opts.pop("endpoint_url", None) or client.pop("endpoint_url", None)
    if endpoint is not None:
        out["endpoint"] = str(endpoint)
    region = client.pop("region_name", None) or opts.pop("region_name", None)
    if region is not None:
        out["region"] = str(region)
    s3_config = config.pop("s3", None) or {}
    if s3_config.get("addressing_style", "path") not in ("path", "auto"):
        unsupported.append("config_kwargs.s3.addressing_style")
    unsupported += [f"config_kwargs.{k}" for k in config if k not in _IGNORED_CONFIG]
    unsupported += [f"client_kwargs.{k}" for k in client]
    unsupported += [k for k in opts if k not in _IGNORED]
    return out, sorted(unsupported)


def started_here() -> bool:
    """Whether obstore made requests in this process."""
    return _started_in == os.getpid()


def started_elsewhere() -> bool:
    """Whether obstore made requests in a parent of this forked process (its runtime does not
    survive the fork: its first request here would hang)."""
    return _started_in is not None and _started_in != os.getpid()


def _starting() -> None:
    """Note that obstore makes requests in this process; refuse in a process forked after
    obstore made requests above it (its first request would hang)."""
    global _started_in
    if _started_in != os.getpid():
        if _started_in is not None:
            raise RuntimeError(
                "obstore made requests in the parent of this forked process: its runtime does "
                "not survive a fork (read through fsspec, or start processes with 'spawn')"
            )
        _started_in = os.getpid()


def _region(config: dict[str, Any]) -> str | None:
    """The region of :func:`obstore_config`'s ``config``, the environment or the AWS config."""
    region = config.get("region") or os.environ.get("AWS_REGION")
    if region or os.environ.get("AWS_DEFAULT_REGION"):
        return region or os.environ.get("AWS_DEFAULT_REGION")
    config_file = os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"
    if not os.path.isfile(os.path.expanduser(config_file)):
        return None  # botocore has nowhere else to find it (and takes ~0.2 s to import)
    import botocore.session  # type: ignore[import-untyped,unused-ignore]

    found = botocore.session.Session(profile=config.get("profile")).get_config_variable("region")
    return None if found is None else str(found)


def _botocore_provider(profile: str | None) -> Any:
    """A credential provider for obstore answering from botocore's chain (as s3fs does)."""
    import botocore.session  # type: ignore[import-untyped,unused-ignore]

    session = botocore.session.Session(profile=profile)
    found = session.get_credentials()
    if found is None:
        return None

    def provide() -> dict[str, Any]:
        frozen = found.get_frozen_credentials()
        expiry = getattr(found, "_expiry_time", None)  # refreshable credentials (STS, SSO ...)
        soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": None if expiry is None else min(expiry, soon),
        }

    return provide


def _store(bucket: str, prefix: str, options: Any) -> Any:
    """The ``S3Store`` of ``bucket``/``prefix`` for ``options`` (retries off, timeouts set)."""
    from obstore.store import S3Store  # type: ignore[import-not-found,unused-ignore]

    kwargs, _ = obstore_config(options.storage_options)
    profile = kwargs.pop("profile", None)
    endpoint = kwargs.get("endpoint", "")
    deadline = options.deadline if options.deadline is not None else 24 * 3600.0
    client = {
        "connect_timeout": datetime.timedelta(seconds=options.connect_timeout),
        "read_timeout": datetime.timedelta(seconds=options.read_timeout),
        "timeout": datetime.timedelta(seconds=deadline),  # one attempt within the deadline
        "allow_http": endpoint.startswith("http://"),
    }
    provider = None
    if "access_key_id" not in kwargs and not kwargs.get("skip_signature"):
        provider = _botocore_provider(profile)
    kwargs["region"] = _region({**kwargs, "profile": profile}) or "us-east-1"
    retry = {"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=deadline)}
    return S3Store(
        bucket,
        prefix=prefix or None,
        client_options=client,  # type: ignore[arg-type,unused-ignore]
        retry_config=retry,  # type: ignore[arg-type,unused-ignore]
        credential_provider=provider,
        **kwargs,
    )


class ObstoreFiles:
    """The files under an ``s3://bucket/prefix`` root, read through obstore with the calls of
    an fsspec filesystem that :class:`~wdsloader.io.retry.RemoteFiles` makes; paths are
    relative to the root. Errors are translated (see the module docstring)."""

    protocol = "s3"
    async_impl = False

    def __init__(self, root: str, options: Any) -> None:
        _, path = split_protocol(root)
        bucket, _, prefix = (path or "").strip("/").partition("/")
        self._shown = f"s3://{bucket}/{prefix}".rstrip("/")
        self._store = _store(bucket, prefix, options)

    def __repr__(self) -> str:
        return f"ObstoreFiles({self._shown!r})"  # never the store's config (its keys)

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} is not pickled (it is rebuilt in each process)")

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (to its end when ``end`` is None or past it)."""

        begin = start or 0
        if end is not None and end <= begin:
            return b""
        if end is not None:
            return bytes(self.cat_buffer(path, begin, end))
        _starting()
        try:
            return bytes(_run(_get_from(self._store, path, begin)))
        except Exception as exc:
            raise translate(exc) from None

    def cat_buffer(self, path: str, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of ``path`` (``start < end``) as obstore received them: a
        view of its buffer, not copied into a ``bytes``."""
        _starting()
        try:
            return memoryview(_run(_get_range(self._store, path, start, end))).cast("B")
        except Exception as exc:
            raise translate(exc) from None

    def info(self, path: str) -> dict[str, Any]:
        """``{"name", "size", "type"}`` of ``path`` (one HEAD request)."""
        import obstore  # type: ignore[import-not-found,unused-ignore]

        _starting()
        try:
            meta = obstore.head(self._store, path)
        except Exception as exc:
            raise translate(exc) from None
        return {"name": path, "size": int(meta["size"]), "type": "file"}

    def ls(self, path: str, detail: bool = True) -> list[dict[str, Any]]:
        """The files directly under the folder ``path`` (``""``: the root)."""
        import obstore  # type: ignore[import-not-found,unused-ignore]

        _starting()
        try:
            found = obstore.list_with_delimiter(self._store, path.strip("/") or None)
        except Exception as exc:
            raise translate(exc) from None
        return [
            {"name": str(m["path"]), "size": int(m["size"]), "type": "file"}
            for m in found["objects"]
        ]

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing to do: listings are not cached."""


_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_loop_lock = threading.Lock()


def _run(coro: Any) -> Any:
    """``coro``'s result, run on this process's event loop thread: the calling thread waits
    without the GIL, so the requests of many threads run at once (obstore's blocking calls
    run one at a time)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="wdsloader-obstore", daemon=True
            )
            thread.start()
            _loop = (os.getpid(), loop)
        loop = _loop[1]
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def _get_range(store: Any, path: str, start: int, end: int) -> Any:
    import obstore  # type: ignore[import-not-found,unused-ignore]

    return await obstore.get_range_async(store, path, start=start, end=end)


async def _get_from(store: Any, path: str, start: int) -> Any:
    import obstore  # type: ignore[import-not-found,unused-ignore]

    result = await obstore.get_async(store, path, options={"range": {"offset": start}})
    return await result.bytes_async()


_STATUS = re.compile(r"status code: (\d{3})")
_S3_CODE = re.compile(r"<Code>([^<]{1,64})</Code>")
_OS_CODE = re.compile(r"Os \{\s*code: (\d+)")
_MESSAGE = re.compile(r'message: "([^"]{1,200})"')
_TLS = ("certificate", "UnknownIssuer", "InvalidCertificate", "CertNotValid")


def translate(exc: BaseException) -> BaseException:
    """The Python error :mod:`wdsloader.io.transient` classifies, for an obstore error (its
    first line kept as the message; the response body cut short); others are returned as they
    are."""
    text = str(exc)
    head, _, debug = text.partition("\n\nDebug source:")
    head = head[:400]
    status = _STATUS.search(head)
    if isinstance(exc, FileNotFoundError) or (status and status.group(1) == "404"):
        return FileNotFoundError(errno.ENOENT, head)
    kind = type(exc).__name__
    if kind in ("PermissionDeniedError", "UnauthenticatedError"):
        return PermissionError(errno.EACCES, head)
    if status is not None:
        code = _S3_CODE.search(text)
        return ObjectStoreError(head, int(status.group(1)), code.group(1) if code else None)
    if "HTTP error" in head or "inner: Http(" in debug:
        return _network_error(head, debug)
    if not type(exc).__module__.startswith("obstore"):
        return exc
    return ObjectStoreError(f"{kind}: {head}")


def _network_error(head: str, debug: str) -> BaseException:
    """A failure to reach the store or to receive its whole answer, as the builtin error."""
    messages = _MESSAGE.findall(debug)
    detail = f"{head} ({messages[-1]})" if messages else head
    if any(t in debug for t in _TLS):
        return ssl.SSLCertVerificationError(1, detail)
    os_code = _OS_CODE.search(debug)
    if os_code is not None:
        number = int(os_code.group(1))
        return OSError(number, detail) if number else ConnectionError(detail)
    if "kind: Timeout" in debug or "TimedOut" in debug or "timed out" in debug:
        return TimeoutError(errno.ETIMEDOUT, detail)
    return ConnectionError(detail)
