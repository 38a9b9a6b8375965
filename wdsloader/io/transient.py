"""Which storage errors are worth retrying: network failures, timeouts and server-side answers
(5xx, throttling), whichever client raised them (aiohttp for HTTP(S), botocore under s3fs) and
whatever wraps them (s3fs re-raises S3 errors as ``OSError``, ``FileNotFoundError`` or
``PermissionError`` with the client's error as ``__cause__``).

The rules, over the exception and the exceptions it was raised from (``__cause__``, and
``__context__`` where Python would show it):

0. A mistake of setup fails at once (:func:`permanent_failure`): a TLS error (a certificate
   not verified, a handshake refused: botocore's ``SSLError``, aiohttp's ``ClientSSLError``,
   Python's ``ssl.SSLError``), unless the chain shows the peer only closed the connection
   mid-TLS (``SSLEOFError``: a network drop, rule 2); and a proxy that refuses the
   credentials (407). A proxy that refuses or drops the connection is a network failure
   (rule 2): a proxy restarting comes back.
1. An answer of the server decides when one is in the chain: an HTTP status (aiohttp's
   ``ClientResponseError``) or an S3 error (botocore's ``ClientError``, its code and status;
   obstore's errors as :mod:`wdsloader.io.obstore_files` translates them, ``status`` and
   ``code``).
   5xx, 408, 429 and the throttling and "try again" codes (``SlowDown``, ``InternalError``,
   ``ServiceUnavailable``, ``RequestTimeout``, ``Throttling`` ...) are transient; any other
   answer (a 404, a 403, a bad request) is not, so a missing file or a denied access stays one.
2. Otherwise a network failure anywhere in the chain is transient: botocore's connection and
   HTTP client errors (``EndpointConnectionError``, ``ConnectTimeoutError``,
   ``ReadTimeoutError``, ``ConnectionClosedError``, ``ResponseStreamingError``, ...), its
   ``IncompleteReadError``, aiohttp's client errors, timeouts, and connection refused, reset or
   aborted.
3. Otherwise the outermost error decides: ``FileNotFoundError``, ``PermissionError`` and other
   path errors are permanent; another ``OSError`` is transient unless it is ``EINVAL`` (s3fs's
   translation of S3's client errors such as a bad request or range); anything else is not.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
import sys
from collections.abc import Iterator

__all__ = [
    "error_chain",
    "is_network_error",
    "is_transient",
    "permanent_failure",
    "transient_cause",
]

_CHAIN_MAX = 16
_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "EC2ThrottledException",
    }
)
"""Error codes botocore's standard retry mode treats as throttling or transient, plus S3's
``InternalError`` and ``ServiceUnavailable`` (they also come as 500/503)."""


def is_transient(exc: BaseException) -> bool:
    """Whether a storage error is worth retrying (see the module docstring)."""
    if permanent_failure(exc) is not None:
        return False
    chain = list(error_chain(exc))
    for link in chain:
        verdict = _answer(link)
        if verdict is not None:
            return verdict
    if any(is_network_error(link) for link in chain):
        return True
    if isinstance(exc, _PATH_ERRORS):
        return False
    if isinstance(exc, OSError):
        return exc.errno != errno.EINVAL
    return False


def transient_cause(exc: BaseException) -> BaseException:
    """The link of ``exc``'s chain that makes it transient (the one to describe in messages:
    a network error rather than the ``FileNotFoundError`` a client wrapped it in), else
    ``exc``."""
    for link in error_chain(exc):
        if _answer(link) or is_network_error(link):
            return link
    return exc


_CERTIFICATE = (
    "TLS certificate verification failed (not retried: check the endpoint URL and its "
    "certificate, or point AWS_CA_BUNDLE / SSL_CERT_FILE at the CA bundle that signed it)"
)
_HANDSHAKE = (
    "TLS handshake failed (not retried: check the endpoint URL, http:// or https://, and the "
    "server's TLS setup)"
)
_PROXY_AUTH = "the proxy refused the credentials (407; not retried: check the proxy settings)"
_TLS_CUT = ("UNEXPECTED_EOF_WHILE_READING", "EOF occurred in violation of protocol")


def permanent_failure(exc: BaseException) -> tuple[BaseException, str] | None:
    """The link of ``exc``'s chain that makes it a setup mistake never worth retrying (a TLS
    certificate or handshake error, a proxy refusing the credentials), with what to check;
    None if there is none (see the module docstring, rule 0)."""
    chain = list(error_chain(exc))
    inner = chain + [w for link in chain for w in _wrapped(link)]
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in inner):
        return next(link for link in chain if _is_tls(link)), _CERTIFICATE
    tls = next((link for link in chain if _is_tls(link)), None)
    if tls is not None and not any(_tls_cut(e) for e in inner):
        return tls, _HANDSHAKE
    for link in chain:
        if _is_proxy(link) and any("407" in str(e) for e in (link, *_wrapped(link))):
            return link, _PROXY_AUTH
    return None


def _wrapped(exc: BaseException) -> list[BaseException]:
    """The errors a client error carries as an attribute rather than as its cause (botocore's
    ``error=``, aiohttp's ``os_error`` and ``certificate_error``)."""
    kwargs = getattr(exc, "kwargs", None)
    found = [kwargs.get("error")] if isinstance(kwargs, dict) else []
    found += [getattr(exc, "os_error", None), getattr(exc, "certificate_error", None)]
    return [e for e in found if isinstance(e, BaseException) and e is not exc]


def _is_tls(exc: BaseException) -> bool:
    if isinstance(exc, ssl.SSLError):  # also aiohttp's ClientConnectorCertificateError
        return True
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.SSLError):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientSSLError)


def _tls_cut(exc: BaseException) -> bool:
    """The peer closed the connection mid-TLS: a network drop, not a setup mistake."""
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return True
    return any(t in str(exc) for t in _TLS_CUT)


def _is_proxy(exc: BaseException) -> bool:
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.ProxyConnectionError):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exc, aiohttp.ClientProxyConnectionError)


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first (at most 16)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < _CHAIN_MAX:
        seen.add(id(link))
        yield link
        cause = link.__cause__
        if cause is None and not link.__suppress_context__:
            cause = link.__context__
        link = cause


def _answer(exc: BaseException) -> bool | None:
    """Whether the server's answer that ``exc`` carries is transient; None if it carries none."""
    response = getattr(exc, "response", None)
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, botocore.ClientError):
        error = response.get("Error", {}) if isinstance(response, dict) else {}
        meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
        code, status = error.get("Code"), meta.get("HTTPStatusCode")
        if code in _TRANSIENT_CODES:
            return True
        return isinstance(status, int) and _transient_status(status)
    status = getattr(exc, "status", None)
    code = getattr(exc, "code", None)  # an S3 code beside the status (obstore's, translated)
    if isinstance(code, str) and code in _TRANSIENT_CODES:
        return True
    if isinstance(status, int) and not isinstance(status, bool):
        return _transient_status(status)
    return None


def _transient_status(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def is_network_error(exc: BaseException) -> bool:
    """A failure to reach the server or to get its whole answer (no answer to judge: an
    HTTP status is one, see :func:`is_transient`)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True  # ConnectionError: refused, reset, aborted, broken pipe
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(
        exc, (botocore.ConnectionError, botocore.HTTPClientError, botocore.IncompleteReadError)
    ):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return (
        aiohttp is not None
        and isinstance(exc, aiohttp.ClientError)
        and not isinstance(exc, (aiohttp.InvalidURL, aiohttp.ClientResponseError))
    )
