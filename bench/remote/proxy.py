"""A latency and bandwidth proxy on loopback, in front of an HTTP (S3) server.

This sandbox's kernel has no netem, so the remote benchmark puts this TCP proxy between every
reader and the S3 server on 127.0.0.1. Each direction of each connection delays every chunk by
half the round-trip time (so a request and its response together pay one RTT, and chunks in
flight overlap as on a real link) and holds the connection to ``rate_bytes_per_s`` (a
per-connection bandwidth cap, as one TCP stream gets on a real path).

It also counts, per connection and in total, the requests it forwards by kind (``GET`` with a
``Range``, whole-object ``GET``, ``HEAD``, ``LIST``, others) and the bytes each way: the
request log every result reports. :class:`LatencyProxy` runs its own event loop in a daemon
thread, so the process that starts it stays free.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256  # per direction: 16 MiB in flight at most (above 40 ms x 1 Gbit/s)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A path: round-trip time and per-connection bandwidth (``None``: uncapped)."""

    name: str
    rtt_s: float
    rate_bytes_per_s: float | None


PROFILES = {
    "40ms": Profile("40ms", 0.040, 125e6),  # 40 ms RTT, 1 Gbit/s per connection
    "2ms": Profile("2ms", 0.002, 125e6),  # 2 ms RTT, 1 Gbit/s per connection
    "none": Profile("none", 0.0, None),  # a plain pipe: the server's own ceiling
}


def classify(head: bytes) -> str:
    """The kind of an HTTP request from its header block: ``GET-range``, ``GET``, ``HEAD``,
    ``LIST`` (a GET of a bucket or with ``list-type``/``prefix`` in the query), or the method."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    method = parts[0].decode("latin-1", "replace").upper()
    target = parts[1].decode("latin-1", "replace") if len(parts) > 1 else "/"
    if method != "GET":
        return method
    path, _, query = target.partition("?")
    if "list-type" in query or "prefix=" in query or path.strip("/").count("/") == 0:
        return "LIST"
    return "GET-range" if b"\nrange:" in b"\n" + rest.lower().replace(b"\r", b"") else "GET"


def _content_length(head: bytes) -> int:
    for raw in head.split(b"\r\n")[1:]:
        name, _, value = raw.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0


class RequestCounter:
    """Splits a client's byte stream into HTTP requests (headers, then ``Content-Length``
    bytes of body) and counts them by kind."""

    def __init__(self, counts: collections.Counter[str]) -> None:
        self.counts = counts
        self.heads: list[bytes] = []  # the header blocks of the requests fed since last taken
        self.buf = b""
        self.body_left = 0

    def feed(self, data: bytes) -> None:
        while data:
            if self.body_left:
                used = min(self.body_left, len(data))
                self.body_left -= used
                data = data[used:]
                continue
            self.buf += data
            data = b""
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.buf[:end], self.buf[end + 4 :]
            self.buf = b""
            self.counts[classify(head)] += 1
            self.heads.append(head)
            self.body_left = _content_length(head)


class LatencyProxy:
    """``127.0.0.1:<port>`` forwarding to ``target`` with ``profile``'s delay and cap."""

    def __init__(self, target: tuple[str, int], profile: Profile) -> None:
        self.target = target
        self.profile = profile
        self.port = 0
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._bytes = {"down": 0, "up": 0}
        self._connections = 0
        self._log: list[tuple[float, int, str, str, str]] = []
        self._t0 = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyProxy:
        """Listen (on a free port) and return once connections are accepted."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, limit=CHUNK)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="latency-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shut() -> None:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), loop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = self._server = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def snapshot(self, reset: bool = False, log: bool = False) -> dict[str, Any]:
        """Requests by kind, bytes each way and connections since the start (or last reset);
        with ``log``, every request as ``[seconds since then, connection, kind, path, range]``."""
        with self._lock:
            out: dict[str, Any] = {
                "requests": dict(self._counts),
                "bytes_down": self._bytes["down"],
                "bytes_up": self._bytes["up"],
                "connections": self._connections,
            }
            if log:
                out["log"] = [list(entry) for entry in self._log]
            if reset:
                self._counts.clear()
                self._bytes = {"down": 0, "up": 0}
                self._connections = 0
                self._log = []
                self._t0 = time.monotonic()
        return out

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target, limit=CHUNK)
        except OSError:
            client_w.close()
            return
        with self._lock:
            self._connections += 1
            conn_id = self._connections
        counter = RequestCounter(collections.Counter())
        up = asyncio.ensure_future(self._pipe(client_r, server_w, "up", counter, conn_id))
        down = asyncio.ensure_future(self._pipe(server_r, client_w, "down", None))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for w in (client_w, server_w):
            w.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        counter: RequestCounter | None,
        conn_id: int = 0,
    ) -> None:
        """Read chunks as they come; deliver each one RTT/2 after it arrived, and no sooner
        than the bandwidth cap allows after the previous one."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.ensure_future(self._send(queue, writer, direction))
        try:
            while True:
                data = await reader.read(CHUNK)
                if counter is not None and data:
                    counter.feed(data)
                    self._record(counter, conn_id)
                await queue.put((time.monotonic(), data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    def _record(self, counter: RequestCounter, conn_id: int) -> None:
        """Add the requests ``counter`` has seen since last time to the totals and the log."""
        now = time.monotonic()
        with self._lock:
            self._counts.update(counter.counts)
            for head in counter.heads:
                line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace").split(" ")
                rng = next(
                    (
                        h[6:].strip()
                        for h in head.decode("latin-1").split("\r\n")
                        if h.lower().startswith("range:")
                    ),
                    "",
                )
                target = line[1] if len(line) > 1 else ""
                entry = (round(now - self._t0, 4), conn_id, classify(head), target, rng)
                self._log.append(entry)
        counter.counts.clear()
        counter.heads.clear()

    async def _send(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        delay = self.profile.rtt_s / 2
        rate = self.profile.rate_bytes_per_s
        free_at = 0.0  # when the link has sent what came before
        while True:
            arrived, data = await queue.get()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            due = max(arrived + delay, free_at) + (len(data) / rate if rate else 0.0)
            free_at = due
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
            with self._lock:
                self._bytes[direction] += len(data)
