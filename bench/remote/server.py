"""The S3-compatible server of the remote benchmark, on 127.0.0.1, and the ceiling of a path.

``s3rver`` (npm; Node) keeps objects as files and streams a ranged GET from the file, so a
reader's ranged requests cost what they would on a real store; moto's server mode (the test
suite's) reads the whole object for every ranged GET and serves a ranged-read benchmark at a
fraction of the rate, so it is the fallback only (the smoke test, a machine without Node).

    npm install --prefix ~/.cache/wdsloader-bench/s3rver s3rver@3.7.1   # make bench-remote does it
    # or: WDS_S3RVER=/path/to/s3rver

Measured here (2 loaded cores, 3 x 64 MiB objects, no proxy): s3rver 265-355 MB/s with 8 x 16 MiB
or 16 x 8 MiB ranged GETs and 140 MB/s with 8 x 1 MiB; moto 130-165 MB/s and 15 MB/s with 1 MiB
ranges (each range reads the whole 64 MiB object).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

S3RVER_PREFIXES = (
    os.environ.get("WDS_S3RVER_PREFIX", ""),
    os.path.expanduser("~/.cache/wdsloader-bench/s3rver"),  # make bench-remote installs it here
)
S3RVER_KEY = "S3RVER"  # s3rver's built-in access key and secret
MOTO_KEY = "testing"


def find_s3rver() -> str | None:
    """The ``s3rver`` executable: ``$WDS_S3RVER``, an npm prefix above, or on ``PATH``."""
    if os.environ.get("WDS_S3RVER"):
        return os.environ["WDS_S3RVER"]
    for prefix in filter(None, S3RVER_PREFIXES):
        path = os.path.join(prefix, "node_modules", ".bin", "s3rver")
        if os.access(path, os.X_OK):
            return path
    return shutil.which("s3rver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """An S3 server on 127.0.0.1 (``kind``: ``s3rver`` or ``moto``); a context manager."""

    def __init__(self, kind: str = "auto", data_dir: str | None = None) -> None:
        exe = find_s3rver() if kind in ("auto", "s3rver") else None
        if kind == "s3rver" and exe is None:
            raise RuntimeError("s3rver not found: npm install s3rver (see bench/remote/server.py)")
        self.kind = "s3rver" if exe else "moto"
        self.exe = exe
        self.data_dir = data_dir
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._moto: Any = None
        self._tmp: str | None = None

    @classmethod
    def existing(cls, endpoint: str) -> S3Server:
        """A server already running at ``endpoint`` (``http://127.0.0.1:PORT``; moto's keys):
        start and stop leave it alone."""
        server = cls("moto")
        server.kind = "existing"
        server.port = int(endpoint.rstrip("/").rsplit(":", 1)[1])
        return server

    @property
    def key(self) -> str:
        return S3RVER_KEY if self.kind == "s3rver" else MOTO_KEY

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def pid(self) -> int | None:
        """The server's process (None: moto in this process, or a server started elsewhere)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> S3Server:
        if self.kind == "existing":
            return self
        if self.kind == "moto":
            import logging

            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a log line per request
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            self.port = int(self._moto.get_host_and_port()[1])
            return self
        if self.data_dir is None:
            self._tmp = self.data_dir = tempfile.mkdtemp(prefix="wds-s3rver-")
        self.port = free_port()
        assert self.exe is not None
        cmd = [self.exe, "-d", self.data_dir, "-a", "127.0.0.1", "-p", str(self.port), "-s"]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(self.address, timeout=1).close()
                return self
            except OSError:
                if self._proc.poll() is not None:
                    err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                    raise RuntimeError(f"s3rver exited {self._proc.returncode}: {err}") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"s3rver did not listen on 127.0.0.1:{self.port} within 30 s")

    def stop(self) -> None:
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """fsspec ``storage_options`` for this server, or for ``endpoint`` (the proxy)."""
        url = endpoint or f"http://127.0.0.1:{self.port}"
        return {
            "key": self.key,
            "secret": self.key,
            "client_kwargs": {"endpoint_url": url},
            "skip_instance_cache": True,
        }

    def env(self, endpoint: str) -> dict[str, str]:
        """The environment boto3-based readers (LitData, Mosaic) are configured by."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ENDPOINT_URL_S3": endpoint,
            "S3_ENDPOINT_URL": endpoint,  # Mosaic Streaming
        }


def signed_headers(address: tuple[str, int], path: str, key: str, rng: str) -> dict[str, str]:
    """SigV4 headers of a ranged GET of ``path`` at ``address`` (botocore signs; no client)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"http://{address[0]}:{address[1]}{path}"
    request = AWSRequest(method="GET", url=url, headers={"Range": rng})
    S3SigV4Auth(Credentials(key, key), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def ceiling(
    address: tuple[str, int],
    objects: list[tuple[str, int]],
    key: str,
    range_bytes: int = 16 * 2**20,
    parallel: int = 8,
) -> dict[str, Any]:
    """The path's ceiling: every byte of ``objects`` (``(path, size)``) fetched as
    ``range_bytes`` ranged GETs, ``parallel`` connections at once (plain http.client, each
    request signed beforehand), each body read into one buffer and dropped."""
    ranges = [(p, s, min(s + range_bytes, n)) for p, n in objects for s in range(0, n, range_bytes)]
    signed = [(p, signed_headers(address, p, key, f"bytes={s}-{e - 1}")) for p, s, e in ranges]
    chunks = [signed[i::parallel] for i in range(parallel)]

    def fetch(todo: list[tuple[str, dict[str, str]]]) -> int:
        conn = http.client.HTTPConnection(*address, timeout=120)
        got = 0
        buf = bytearray(2**20)
        for path, headers in todo:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            if resp.status not in (200, 206):
                raise RuntimeError(f"ceiling: GET {path} answered {resp.status}")
            while n := resp.readinto(buf):
                got += n
        conn.close()
        return got

    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        total = sum(pool.map(fetch, chunks))
    seconds = time.perf_counter() - t0
    return {
        "bytes": total,
        "seconds": seconds,
        "mb_per_s": total / seconds / 1e6,
        "range_bytes": range_bytes,
        "parallel": parallel,
        "requests": len(ranges),
    }


def warm_up(
    server: S3Server,
    objects: list[tuple[str, int]],
    *,
    range_bytes: int = 2**20,
    rounds: int = 8,
    least: int = 3,
    settle: float = 0.15,
) -> list[dict[str, Any]]:
    """Serve ``objects`` as 1 MiB ranged GETs (8 connections) for at least ``least`` rounds,
    then until the server's CPU per MB settles (two rounds in a row within ``settle`` of each
    other) or ``rounds`` are done.

    A fresh s3rver (Node) spent up to 2.6x the CPU per MB of a warmed one on its first few
    thousand ranged GETs; without a warm-up the first system measured pays for it. Returns each
    round's ``ms_per_mb`` and ``mb_per_s``: none where the server's CPU cannot be read (moto in
    this process, a server started elsewhere, no /proc)."""
    from bench.remote.machine import process_tree_cpu

    done: list[dict[str, Any]] = []
    for _ in range(rounds if server.pid else 0):
        c0 = process_tree_cpu(server.pid)
        res = ceiling(server.address, objects, server.key, range_bytes, 8)
        c1 = process_tree_cpu(server.pid)
        if c0 is None or c1 is None:
            return []
        ms = (c1 - c0) / res["bytes"] * 1e9
        done.append({"ms_per_mb": ms, "mb_per_s": res["mb_per_s"], "requests": res["requests"]})
        last = done[-2]["ms_per_mb"] if len(done) >= least else None
        if last and abs(ms - last) <= settle * last:
            break
    return done
