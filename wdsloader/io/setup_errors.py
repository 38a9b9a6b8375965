"""Storage set-up mistakes in one line: a missing bucket, an endpoint nobody answers at, missing
or refused credentials. :func:`setup_error` recognises them in whatever a client raised (s3fs's
``FileNotFoundError: The specified bucket does not exist``, botocore's
``EndpointConnectionError``, aiohttp's connection errors, wrapped or not; a server that
accepts connections and does not answer is a timeout, reported by the reads themselves) and gives a
:class:`~wdsloader.errors.StorageSetupError` naming the URL (credentials redacted), the
endpoint and what to check; any other error is left to its caller.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from wdsloader.errors import StorageSetupError
from wdsloader.io.transient import error_chain
from wdsloader.redact import redact, secrets_of

__all__ = ["endpoint_of", "setup_error", "setup_errors_in_one_line"]

_S3 = ("s3", "s3a")
_NO_BUCKET = "specified bucket does not exist"
_REFUSED_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
    }
)


def setup_error(
    exc: BaseException,
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    fs: Any = None,
) -> StorageSetupError | None:
    """The set-up mistake behind ``exc``, raised while using ``url``, as one line; None when
    ``exc`` is not one (see the module docstring). ``storage_options`` or ``fs`` tell the
    endpoint; their credentials never appear."""
    secrets = secrets_of(dict(storage_options or {}), url)
    where = redact(url, secrets)
    endpoint = endpoint_of(url, storage_options, fs=fs)
    chain = list(error_chain(exc))
    codes = {code for code in map(_code, chain) if code is not None}
    if "NoSuchBucket" in codes or any(_NO_BUCKET in str(link) for link in chain):
        bucket = _host(url)
        text = (
            f"{where}: the bucket {bucket!r} does not exist at {endpoint}: check the bucket "
            "name and the endpoint (storage option client_kwargs.endpoint_url), or create "
            "the bucket"
        )
    elif any(_cannot_connect(link) for link in chain):
        cause = next(link for link in chain if _cannot_connect(link))
        text = (
            f"{where}: cannot connect to the storage endpoint {endpoint} "
            f"({type(cause).__name__}): "
            "check the endpoint URL (storage option client_kwargs.endpoint_url) and that the "
            "server is running and reachable from here"
        )
    elif any(
        type(link).__name__ in ("NoCredentialsError", "PartialCredentialsError") for link in chain
    ):
        text = (
            f"{where}: no credentials for {endpoint}: give the storage options key and "
            "secret, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        )
    elif codes & _REFUSED_CODES:
        code = sorted(codes & _REFUSED_CODES)[0]
        text = (
            f"{where}: {endpoint} refused the credentials ({code}): check the key and secret "
            "(storage options key and secret, AWS_* variables or profile) and the bucket's "
            "policy"
        )
    else:
        return None
    return StorageSetupError(redact(text, secrets))


@contextmanager
def setup_errors_in_one_line(
    url: str, storage_options: Mapping[str, Any] | None = None, *, fs: Any = None
) -> Iterator[None]:
    """Raise a set-up mistake met inside the block as :func:`setup_error`'s one line (from
    None: the client's traceback holds nothing more to act on); other errors pass unchanged."""
    try:
        yield
    except StorageSetupError:
        raise
    except Exception as exc:  # recognised set-up mistakes become one line; the rest as raised
        setup = setup_error(exc, url, storage_options, fs=fs)
        if setup is None:
            raise
        raise setup from None


def endpoint_of(
    url: str, storage_options: Mapping[str, Any] | None = None, *, fs: Any = None
) -> str:
    """The endpoint ``url`` is read from, for messages (credentials redacted)."""
    options = storage_options or {}
    client = options.get("client_kwargs") or {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint is None and fs is not None:
        client = getattr(fs, "client_kwargs", None) or {}
        endpoint = getattr(fs, "endpoint_url", None) or client.get("endpoint_url")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if endpoint is None and scheme in _S3:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint is None:
            return "the default AWS S3 endpoint"
    if endpoint is None and scheme:
        return f"{scheme}://{_host(url)}"
    return redact(endpoint) if endpoint else "the local filesystem"


def _host(url: str) -> str:
    """The host (an S3 URL's bucket) of ``url``, without userinfo."""
    return urllib.parse.urlsplit(url).netloc.rsplit("@", 1)[-1]


def _cannot_connect(exc: BaseException) -> bool:
    """A connection that could not be opened (refused, unknown host, connect timeout): an
    endpoint that is wrong or down. A server that accepts and then stays silent is not one."""
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return True
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.ConnectionError):
        return True  # EndpointConnectionError, ConnectTimeoutError, proxy and TLS failures
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientConnectorError)


def _code(exc: BaseException) -> str | None:
    """The error code of a botocore ``ClientError``, else None."""
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is None or not isinstance(exc, botocore.ClientError):
        return None
    response = exc.response if isinstance(exc.response, dict) else {}
    code = response.get("Error", {}).get("Code")
    return code if isinstance(code, str) else None
