"""A brief outage of the storage endpoint mid-epoch is retried, for S3 (botocore under s3fs) and
HTTP (aiohttp): the epoch completes with every sample exactly once, in the order of a run
without the outage. And the classification of storage errors behind it, class by class."""

from __future__ import annotations

import errno
import logging
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from tests.conftest import new_bucket
from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from tests.outage_proxy import OutageProxy
from wdsloader import create_loader
from wdsloader.errors import ShardReadError
from wdsloader.io import ReadOptions
from wdsloader.io.retry import MAX_BACKOFF_S, Deadline, RemoteFiles, next_retry
from wdsloader.io.transient import is_transient, permanent_failure

COUNTS = [8, 8, 8, 8, 8]
TARGET = "train/shard-000002"  # the endpoint goes down as the epoch starts reading this shard


# -- the classification ----------------------------------------------------------------------------
def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    response = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")  # type: ignore[arg-type]


def _botocore_errors() -> list[tuple[str, Exception, bool]]:
    import botocore.exceptions as b

    url = "http://127.0.0.1:1/bucket/key"
    return [
        ("EndpointConnectionError", b.EndpointConnectionError(endpoint_url=url), True),
        ("ConnectionClosedError", b.ConnectionClosedError(endpoint_url=url), True),
        ("ReadTimeoutError", b.ReadTimeoutError(endpoint_url=url), True),
        ("ConnectTimeoutError", b.ConnectTimeoutError(endpoint_url=url), True),
        ("ResponseStreamingError", b.ResponseStreamingError(error="reset"), True),
        ("IncompleteReadError", b.IncompleteReadError(actual_bytes=1, expected_bytes=9), True),
        ("SlowDown 503", _client_error("SlowDown", 503), True),
        ("InternalError 500", _client_error("InternalError", 500), True),
        ("ServiceUnavailable 503", _client_error("ServiceUnavailable", 503), True),
        ("any 503", _client_error("Whatever", 503), True),
        ("RequestTimeout 400", _client_error("RequestTimeout", 400), True),
        ("NoSuchKey 404", _client_error("NoSuchKey", 404), False),
        ("NoSuchBucket 404", _client_error("NoSuchBucket", 404), False),
        ("AccessDenied 403", _client_error("AccessDenied", 403), False),
        ("InvalidRange 416", _client_error("InvalidRange", 416), False),
        ("NoCredentialsError", b.NoCredentialsError(), False),
    ]


@pytest.mark.parametrize(
    "name, exc, transient", _botocore_errors(), ids=[e[0] for e in _botocore_errors()]
)
def test_botocore_errors_are_classified(name, exc, transient):
    assert is_transient(exc) is transient, name


def _wrapped(outer: BaseException, inner: BaseException, explicit: bool = True) -> BaseException:
    """``outer`` raised from ``inner`` (``raise ... from``), or while handling it."""
    try:
        try:
            raise inner
        except BaseException:
            if explicit:
                raise outer from inner
            raise outer  # noqa: B904 (the implicit __context__ is what is tested)
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    "outer, inner, transient",
    [
        # s3fs re-raises S3 answers as OSError subclasses with the ClientError as cause
        (FileNotFoundError("key"), _client_error("NoSuchKey", 404), False),
        (PermissionError("key"), _client_error("AccessDenied", 403), False),
        (OSError(errno.EIO, "slow down"), _client_error("SlowDown", 503), True),
        (OSError(errno.EREMOTEIO, "internal"), _client_error("InternalError", 500), True),
        (OSError(errno.EIO, "bad request"), _client_error("BadRequest", 400), False),
        # a client that wraps a failure to connect in "not found" (fsspec's HTTP info)
        (FileNotFoundError("key"), "EndpointConnectionError", True),
        (ValueError("wrapped"), "ConnectTimeoutError", True),
    ],
)
def test_wrapped_errors_are_classified_by_their_chain(outer, inner, transient):
    if isinstance(inner, str):
        inner = dict((n, e) for n, e, _ in _botocore_errors())[inner]
    assert is_transient(_wrapped(outer, inner)) is transient
    assert is_transient(_wrapped(outer, inner, explicit=False)) is transient


def test_plain_path_errors_stay_permanent_and_aiohttp_errors_are_classified():
    import aiohttp
    from aiohttp.client_reqrep import RequestInfo
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    info = RequestInfo(URL("http://h/x"), "GET", CIMultiDictProxy(CIMultiDict()), URL("http://h/x"))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "x"))
    assert not is_transient(PermissionError(errno.EACCES, "x"))
    assert not is_transient(OSError(errno.EINVAL, "InvalidRange"))
    assert is_transient(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert is_transient(aiohttp.ServerDisconnectedError())
    assert is_transient(aiohttp.ClientPayloadError("cut"))
    assert is_transient(aiohttp.ClientResponseError(info, (), status=503))
    assert not is_transient(aiohttp.ClientResponseError(info, (), status=404))
    assert not is_transient(aiohttp.InvalidURL("nope"))


def _tls_and_proxy_errors() -> list[tuple[str, BaseException, bool]]:
    import ssl

    import aiohttp
    import botocore.exceptions as b
    from aiohttp.client_reqrep import ConnectionKey

    key = ConnectionKey("h", 443, True, True, None, None, None)
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed")
    handshake = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    eof = ssl.SSLEOFError(8, "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF")
    url, proxy = "https://h/bucket/key", "http://proxy:3128"
    auth = OSError("Tunnel connection failed: 407 Proxy Authentication Required")
    return [
        ("botocore SSLError", b.SSLError(endpoint_url=url, error=verify), False),
        ("botocore SSLError handshake", b.SSLError(endpoint_url=url, error=handshake), False),
        ("aiohttp ClientSSLError", aiohttp.ClientConnectorSSLError(key, handshake), False),
        ("aiohttp certificate", aiohttp.ClientConnectorCertificateError(key, verify), False),
        ("ssl verify in the chain", _wrapped(OSError(5, "read"), verify), False),
        (
            "ssl verify under botocore",
            _wrapped(b.SSLError(endpoint_url=url, error="x"), verify),
            False,
        ),
        # the peer closed the connection mid-TLS: a network drop, retried
        ("ssl EOF", eof, True),
        ("aiohttp SSL EOF", aiohttp.ClientConnectorSSLError(key, eof), True),
        ("botocore SSLError EOF", b.SSLError(endpoint_url=url, error=eof), True),
        # a proxy that refuses the connection may come back; one that refuses the credentials won't
        ("botocore proxy refused", b.ProxyConnectionError(proxy_url=proxy, error="refused"), True),
        (
            "aiohttp proxy refused",
            aiohttp.ClientProxyConnectionError(key, ConnectionRefusedError()),
            True,
        ),
        ("botocore proxy 407", b.ProxyConnectionError(proxy_url=proxy, error=auth), False),
    ]


@pytest.mark.parametrize(
    "name, exc, transient", _tls_and_proxy_errors(), ids=[e[0] for e in _tls_and_proxy_errors()]
)
def test_tls_and_proxy_errors_are_classified(name, exc, transient):
    """A certificate or TLS handshake error was retried until the deadline (botocore's SSLError
    is a ConnectionError, aiohttp's ClientSSLError a client error)."""
    assert is_transient(exc) is transient, name
    assert (permanent_failure(exc) is None) is transient, name


def test_a_tls_error_fails_at_once_saying_what_to_check():
    import ssl

    import botocore.exceptions as b

    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed")
    exc = _wrapped(OSError(5, "read"), b.SSLError(endpoint_url="https://h/b/k", error=verify))
    files = RemoteFiles(
        SimpleNamespace(protocol="s3"),
        "b",
        ReadOptions(),
        url=lambda r: f"s3://b/{r}",
        count=lambda *a: None,
        redact=str,
    )
    with pytest.raises(ShardReadError) as err:
        files.retry_or_raise(exc, "s3://b/train/shard-000000.tar", 0, 0, False, Deadline(60))
    assert str(err.value).startswith(
        "s3://b/train/shard-000000.tar: read failed at byte offset 0: TLS certificate "
        "verification failed (not retried: check the endpoint URL and its certificate, or point "
        "AWS_CA_BUNDLE / SSL_CERT_FILE at the CA bundle that signed it): SSLError: SSL "
        "validation failed for https://h/b/k"
    )


class _Answers:
    """A filesystem whose ``cat_file`` answers from ``answers`` in turn (bytes or errors)."""

    protocol = "s3"

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[int, int]] = []

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        self.calls.append((start, end))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


def _files(fs: _Answers, observed: list[tuple[int, float]] | None = None) -> RemoteFiles:
    return RemoteFiles(
        fs,
        "b",
        ReadOptions(backoff=0),
        url=lambda r: f"s3://b/{r}",
        count=lambda *a: None,
        redact=str,
        observe=None if observed is None else lambda n, s: observed.append((n, s)),
    )


def test_a_range_answered_whole_is_returned_as_it_came_and_retried_whole():
    whole = bytes(range(200)) * 50
    observed: list[tuple[int, float]] = []
    files = _files(_Answers(whole), observed)
    assert files.fetch("k", 100, 100 + len(whole)) is whole  # no copy of the bytes
    assert [n for n, _ in observed] == [len(whole)]  # the store's probe sees the request
    # a connection reset: the range asked for again, and the answer returned
    fs = _Answers(ConnectionResetError(errno.ECONNRESET, "reset"), b"abcdefg")
    assert _files(fs).fetch("k", 0, 7) == b"abcdefg"
    assert fs.calls == [(0, 7), (0, 7)]
    # an index read up to one byte past its size: a shorter file's bytes as they came
    short = b"x" * 56
    assert _files(_Answers(short)).fetch_upto("k.idx", 57) is short


# -- an outage mid-epoch, through a real server ----------------------------------------------------
@contextmanager
def _outage_at(proxy: OutageProxy, target: str, monkeypatch) -> Iterator[list[str]]:
    """The endpoint goes down before the first read of ``target`` and comes back from the
    retry of the first failed attempt (the "retrying" log line): no timing involved."""
    fetch, fetch_buffer = RemoteFiles.fetch, RemoteFiles.fetch_buffer
    retried: list[str] = []

    def fetch_with_outage(self, rel, start=0, stop=None):
        if target in rel and proxy.downs == 0:
            proxy.down()
        return fetch(self, rel, start, stop)

    def fetch_buffer_with_outage(self, rel, start, stop):  # the batches' reads
        if target in rel and proxy.downs == 0:
            proxy.down()
        return fetch_buffer(self, rel, start, stop)

    class Restart(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying" in record.getMessage():
                retried.append(record.getMessage())
                proxy.up()

    monkeypatch.setattr(RemoteFiles, "fetch", fetch_with_outage)
    monkeypatch.setattr(RemoteFiles, "fetch_buffer", fetch_buffer_with_outage)
    log = logging.getLogger("wdsloader.io.retry")
    handler, level = Restart(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield retried
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _epoch(root: str, **kw) -> list[str]:
    opts = ReadOptions(retries=3, backoff=0.0, concurrency=2, max_request_bytes=4096, **kw)
    loader = create_loader(root, "train", 4, seed=3, read_options=opts)
    return [k for b in loader for k in b["__key__"]]


def _check(
    keys: list[str], reference: list[str], retried: list[str], downs: int, store: str
) -> None:
    assert downs == 1 and retried, "the outage did not happen"
    # the target's read, or another read in flight when the endpoint went down (concurrency=2:
    # whichever fails first brings the endpoint back), is the one retried
    assert all(line.startswith(store) for line in retried), retried
    assert len(keys) == sum(COUNTS) and len(set(keys)) == sum(COUNTS)  # each exactly once
    assert keys == reference


def test_s3_outage_mid_epoch_is_retried_and_the_epoch_completes_exactly_once(
    s3_server, s3_transport, monkeypatch
):
    """With each transport: botocore under s3fs, and obstore (its own retries off)."""
    url, options = new_bucket(s3_server)
    root = f"{url}/ds"
    write_dataset(root, {"train": COUNTS}, storage_options=options)
    reference = _epoch(root, storage_options=options)
    parts = urllib.parse.urlsplit(s3_server)
    with OutageProxy((str(parts.hostname), int(parts.port or 80))) as proxy:
        through = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
        with _outage_at(proxy, TARGET, monkeypatch) as retried:
            keys = _epoch(root, storage_options=through, transport=s3_transport)
        downs = proxy.downs
    _check(keys, reference, retried, downs, f"{root}/train/")


def test_http_outage_mid_epoch_is_retried_and_the_epoch_completes_exactly_once(
    http_server, monkeypatch
):
    write_dataset(str(http_server.root / "ds"), {"train": COUNTS})
    reference = _epoch(f"{http_server.url}/ds")
    parts = urllib.parse.urlsplit(http_server.url)
    with OutageProxy((str(parts.hostname), int(parts.port or 80))) as proxy:
        with _outage_at(proxy, TARGET, monkeypatch) as retried:
            keys = _epoch(f"{proxy.url}/ds")
        downs = proxy.downs
    _check(keys, reference, retried, downs, f"{proxy.url}/ds/train/")


def test_one_backoff_for_shard_reads_and_root_files():
    """``next_retry`` (shared by the shard reads' and ``read_root_file``'s retry loops): the
    wait doubles from ``backoff`` up to the cap; no retry after the last, nor when the
    deadline comes before the wait ends, and then the error's clause names the deadline."""
    options = ReadOptions(retries=3, backoff=0.5)
    unlimited = Deadline(None)
    assert [next_retry(options, a, unlimited) for a in range(5)] == [
        (0.5, None), (1.0, None), (MAX_BACKOFF_S, None), (MAX_BACKOFF_S, ""), (MAX_BACKOFF_S, ""),
    ]  # fmt: skip
    assert next_retry(options, 0, Deadline(60)) == (0.5, None)
    assert next_retry(options, 0, Deadline(0.1)) == (0.5, ", the deadline of 0.1s reached")
    assert next_retry(options, 3, Deadline(0.1)) == (2.0, ", the deadline of 0.1s reached")
