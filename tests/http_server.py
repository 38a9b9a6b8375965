"""A threaded HTTP server on 127.0.0.1 for tests: serves a folder with HEAD, single-range GET and
directory listings, logs every request, and drops connections mid-body on demand.

Faults apply to GETs of paths ending with ``Faults.suffix``:

- ``first_gets=N``: the first N such GETs send the headers and half of the requested bytes, then
  close the connection;
- ``at_byte=X, at_byte_times=M``: the first M such GETs whose range covers byte X send the bytes
  before X, then close the connection (so X is the first byte the client did not receive);
- ``gate``: a ``threading.Barrier`` each such GET waits at before answering (a test of concurrency:
  it only opens when that many requests are in flight at once);
- ``hook``: called with each such GET's path, start and stop once it is logged, before it is
  answered (a test may hold a request there, e.g. until another one arrives);
- ``stall="answer"``: such GETs are read and never answered; ``stall="body"``: they get their
  status and headers, then no byte of the body (both until the server stops);
- ``status=S``: such GETs are answered with HTTP status S and an empty body; with
  ``redirect_query=Q`` a GET without a query string is first redirected (302) to the same path
  with ``?Q`` (as a CDN redirects to a signed URL), and only that GET gets status S.

:class:`SilentServer` is a TCP server that accepts connections and never reads or answers.
"""

from __future__ import annotations

import html
import logging
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

logger = logging.getLogger(__name__)
_CHUNK = 1 << 16


@dataclass
class Faults:
    """Which GETs to break (see the module docstring)."""

    first_gets: int = 0
    at_byte: int | None = None
    at_byte_times: int = 0
    suffix: str = ".tar"
    gate: threading.Barrier | None = None
    hook: Callable[[str, int, int], None] | None = None
    stall: str | None = None
    status: int | None = None
    redirect_query: str | None = None


@dataclass(frozen=True)
class Request:
    """One request, logged before its response goes out: ``start``/``stop`` is the byte range
    answered (stop exclusive), ``sent`` the body bytes sent (fewer than asked when ``dropped``)."""

    seq: int
    method: str
    path: str
    start: int | None
    stop: int | None
    status: int
    sent: int
    dropped: bool


@dataclass
class _State:
    faults: Faults = field(default_factory=Faults)
    log: list[Request] = field(default_factory=list)
    seq: int = 0
    first_gets_done: int = 0
    at_byte_done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends stalls


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``(start, stop)`` for a single ``bytes=`` range, None for no/unsupported range (whole
    file), ``"unsatisfiable"`` when it starts at or past the end."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].strip().partition("-")
    try:
        if not first:  # suffix range: the last N bytes
            n = int(last)
            return (max(size - n, 0), size) if n > 0 else "unsatisfiable"
        start = int(first)
        stop = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    if start >= size:
        return "unsatisfiable"
    return (start, stop) if stop > start else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as servers of object stores set it: a response's headers and body are two
    # writes, and with Nagle's algorithm the body waited for the client's delayed ACK of the
    # headers (~40 ms per response on loopback)
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        logger.debug("%s " + format, self.address_string(), *args)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        state = self.server.state
        with state.lock:
            state.seq += 1
            seq = state.seq
        url_path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        root = self.server.root
        target = (root / url_path.lstrip("/")).resolve()
        record = {"seq": seq, "method": self.command, "path": url_path, "start": None, "stop": None}
        if root != target and root not in target.parents:
            self._finish(record, HTTPStatus.FORBIDDEN)
        elif target.is_dir():
            self._listing(record, target, body)
        elif not target.is_file():
            self._finish(record, HTTPStatus.NOT_FOUND)
        elif body and self._status_fault(record, url_path):
            return
        else:
            self._file(record, target, body)

    def _record(self, record: dict, status: int, sent: int = 0, dropped: bool = False) -> None:
        """Log a request before any of its response goes out, so a client that has its answer
        always finds it in the log."""
        state = self.server.state
        with state.lock:
            state.log.append(Request(**record, status=int(status), sent=sent, dropped=dropped))

    def _finish(self, record: dict, status: int) -> None:
        """Log and send an empty error response."""
        self._record(record, status)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _listing(self, record: dict, folder: Path, body: bool) -> None:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
        links = "".join(
            f'<li><a href="{html.escape(urllib.parse.quote(n))}">{html.escape(n)}</a></li>'
            for n in names
        )
        page = f"<html><body><ul>{links}</ul></body></html>".encode()
        self._record(record, HTTPStatus.OK, sent=len(page) if body else 0)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        if body:
            self.wfile.write(page)

    def _file(self, record: dict, path: Path, body: bool) -> None:
        size = path.stat().st_size
        span = parse_range(self.headers.get("Range"), size)
        if span == "unsatisfiable":
            self._record(record, HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, stop = span if isinstance(span, tuple) else (0, size)
        record.update(start=start, stop=stop)
        status = HTTPStatus.PARTIAL_CONTENT if isinstance(span, tuple) else HTTPStatus.OK
        stall = self._stall(record["path"]) if body else None
        cut = 0 if stall else self._fault_cut(record["path"], start, stop) if body else None
        limit = stop - start if cut is None else cut
        self._record(record, status, sent=limit if body else 0, dropped=cut is not None)
        hook = self.server.state.faults.hook
        if body and hook is not None and record["path"].endswith(self.server.state.faults.suffix):
            hook(record["path"], start, stop)
        if stall == "answer":
            self._hold()
            return
        self.send_response(status)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(stop - start))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        if stall == "body":
            self.wfile.flush()
            self._hold()
            return
        sent = 0
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                while sent < limit:
                    chunk = f.read(min(_CHUNK, limit - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if cut is not None:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)  # FIN after the partial body
                self.close_connection = True

    def _status_fault(self, record: dict, path: str) -> bool:
        """Answer a GET with the ``status`` fault (after the ``redirect_query`` redirect)."""
        faults = self.server.state.faults
        if faults.status is None or not path.endswith(faults.suffix):
            return False
        query = urllib.parse.urlsplit(self.path).query
        if faults.redirect_query and not query:
            self._record(record, HTTPStatus.FOUND)
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", f"{urllib.parse.quote(path)}?{faults.redirect_query}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._finish(record, faults.status)
        return True

    def _stall(self, path: str) -> str | None:
        """``"answer"`` or ``"body"`` when this GET is to stall, else None."""
        faults = self.server.state.faults
        return faults.stall if faults.stall and path.endswith(faults.suffix) else None

    def _hold(self) -> None:
        """Keep the connection open and silent until the server stops, then close it."""
        self.server.state.release.wait()
        self.close_connection = True

    def _fault_cut(self, path: str, start: int, stop: int) -> int | None:
        """Bytes to send before dropping this GET, or None to serve it whole."""
        state = self.server.state
        faults = state.faults
        if not path.endswith(faults.suffix):
            return None
        if faults.gate is not None:
            faults.gate.wait()
        with state.lock:
            if state.first_gets_done < faults.first_gets:
                state.first_gets_done += 1
                return (stop - start) // 2
            x = faults.at_byte
            if x is not None and start <= x < stop and state.at_byte_done < faults.at_byte_times:
                state.at_byte_done += 1
                return x - start
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    root: Path
    state: _State


class RangeHTTPServer:
    """Serve ``directory`` on ``127.0.0.1:<free port>`` from a background thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.root = Path(directory).resolve()
        self._server.state = _State()
        self._thread: threading.Thread | None = None

    @property
    def root(self) -> Path:
        """The folder served at ``/``."""
        return self._server.root

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def faults(self) -> Faults:
        return self._server.state.faults

    @faults.setter
    def faults(self, value: Faults) -> None:
        state = self._server.state
        with state.lock:
            state.faults = value
            state.first_gets_done = state.at_byte_done = 0

    def requests(self) -> list[Request]:
        """Every request served so far, in arrival order."""
        state = self._server.state
        with state.lock:
            return sorted(state.log, key=lambda r: r.seq)

    def clear_log(self) -> None:
        state = self._server.state
        with state.lock:
            state.log.clear()

    def drops(self) -> int:
        """How many responses were cut short."""
        return sum(r.dropped for r in self.requests())

    def start(self) -> RangeHTTPServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="test-http-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        gate = self.faults.gate
        if gate is not None:
            gate.abort()
        self._server.state.release.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> RangeHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SilentServer:
    """A TCP server on ``127.0.0.1:<free port>`` that accepts connections and never reads or
    answers them (a hung HTTP or S3 endpoint); ``accepted`` counts the connections."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="test-silent-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def accepted(self) -> int:
        return len(self._conns)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self._conns.append(conn)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._conns:
            conn.close()
        self._sock.close()


@pytest.fixture(name="http_server")
def http_server_fixture(tmp_path: Path):
    """A :class:`RangeHTTPServer` serving the empty folder ``tmp_path / "www"``."""
    root = tmp_path / "www"
    root.mkdir()
    with RangeHTTPServer(root) as server:
        yield server
