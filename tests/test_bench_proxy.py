"""The remote benchmark's latency proxy (bench/remote/proxy.py): it delays a round trip by the
profile's RTT, passes bytes through unchanged and counts the requests by kind."""

from __future__ import annotations

import http.client
import http.server
import os
import threading
import time

import pytest

from bench.remote.proxy import LatencyProxy, Profile, classify

BODY = os.urandom(3 * 2**20 + 123)  # not a multiple of the proxy's chunk


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        start, end = 0, len(BODY) - 1
        if self.headers.get("Range"):
            first, last = self.headers["Range"].split("=")[1].split("-")
            start, end = int(first), int(last)
        data = BODY[start : end + 1]
        self.send_response(206 if self.headers.get("Range") else 200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()

    def do_PUT(self) -> None:  # noqa: N802
        got = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(got)))
        self.end_headers()
        self.wfile.write(got)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def _round_trip(port: int, method: str, path: str, **headers: str) -> tuple[float, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()
    t0 = time.perf_counter()
    conn.request(method, path, headers=headers)
    data = conn.getresponse().read()
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed, data


def test_round_trip_pays_the_rtt_and_bytes_pass_unchanged(origin):
    with LatencyProxy(origin, Profile("t", 0.1, None)) as proxy:
        elapsed, data = _round_trip(proxy.port, "GET", "/bucket/key")
        assert data == BODY
        assert 0.1 <= elapsed < 2.0  # one RTT, leniently bounded above on a loaded machine
        elapsed, data = _round_trip(proxy.port, "GET", "/bucket/key", Range="bytes=5-2000000")
        assert data == BODY[5:2000001]
        assert elapsed >= 0.1


def test_bandwidth_cap_holds_a_connection_to_its_rate(origin):
    with LatencyProxy(origin, Profile("t", 0.0, 8e6)) as proxy:  # 3 MiB at 8 MB/s: ~0.39 s
        elapsed, data = _round_trip(proxy.port, "GET", "/bucket/key")
    assert data == BODY
    assert elapsed >= len(BODY) / 8e6 * 0.9


def test_requests_are_counted_by_kind(origin):
    with LatencyProxy(origin, Profile("t", 0.0, None)) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        for method, path, headers in [
            ("GET", "/bucket/key", {"Range": "bytes=0-9"}),
            ("GET", "/bucket/key", {"Range": "bytes=10-19"}),
            ("HEAD", "/bucket/key", {}),
            ("GET", "/bucket/key", {}),
            ("GET", "/bucket?list-type=2&prefix=ds/", {}),
        ]:
            conn.request(method, path, headers=headers)
            conn.getresponse().read()
        conn.request("PUT", "/bucket/up", body=b"x" * 70_000)  # a body over the chunk size
        assert conn.getresponse().read() == b"x" * 70_000
        conn.request("GET", "/bucket/key", headers={"Range": "bytes=0-0"})
        conn.getresponse().read()
        conn.close()
        stats = proxy.snapshot(reset=True, log=True)
        assert proxy.snapshot(log=True)["requests"] == {} and proxy.snapshot(log=True)["log"] == []
    assert stats["requests"] == {"GET-range": 3, "HEAD": 1, "GET": 1, "LIST": 1, "PUT": 1}
    assert stats["connections"] == 1
    log = stats["log"]
    assert [entry[1:] for entry in log] == [
        [1, "GET-range", "/bucket/key", "bytes=0-9"],
        [1, "GET-range", "/bucket/key", "bytes=10-19"],
        [1, "HEAD", "/bucket/key", ""],
        [1, "GET", "/bucket/key", ""],
        [1, "LIST", "/bucket?list-type=2&prefix=ds/", ""],
        [1, "PUT", "/bucket/up", ""],
        [1, "GET-range", "/bucket/key", "bytes=0-0"],
    ]
    assert [entry[0] for entry in log] == sorted(entry[0] for entry in log)
    assert stats["bytes_down"] > len(BODY) + 70_000


def test_classify_names_list_requests():
    assert classify(b"GET /bucket HTTP/1.1\r\nHost: x") == "LIST"
    assert classify(b"GET /bucket/?prefix=a%2F HTTP/1.1\r\nHost: x") == "LIST"
    assert classify(b"GET /bucket/a/b.tar HTTP/1.1\r\nRange: bytes=0-1") == "GET-range"
    assert classify(b"HEAD /bucket/a/b.tar HTTP/1.1\r\n") == "HEAD"


def test_the_server_warm_up_runs_until_the_cpu_per_mb_settles(monkeypatch) -> None:
    """warm_up serves at least 3 rounds, then stops at the first round within 15% of the one
    before (a cold s3rver's first rounds cost 2-2.5x a warm one's CPU per MB)."""
    from bench.remote import machine, server

    cpu = iter([0.0, 6.0, 6.0, 9.0, 9.0, 13.0, 13.0, 15.2, 15.2, 17.3, 17.3, 19.4])
    monkeypatch.setattr(machine, "process_tree_cpu", lambda pid: next(cpu))
    monkeypatch.setattr(
        server, "ceiling", lambda *a, **k: {"bytes": 10**9, "mb_per_s": 500.0, "requests": 954}
    )
    s3 = server.S3Server("moto")
    monkeypatch.setattr(server.S3Server, "pid", property(lambda self: 4242))
    done = server.warm_up(s3, [("/b/x.tar", 10**9)])
    assert [round(d["ms_per_mb"], 1) for d in done] == [6.0, 3.0, 4.0, 2.2, 2.1]
