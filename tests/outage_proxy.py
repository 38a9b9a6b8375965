"""A TCP endpoint on 127.0.0.1 in front of a test server that can be taken down and brought back
on the same port: an outage as a client sees it.

``down()`` closes the listening socket (new connections are refused) and resets every open
connection (kept-alive ones included, so a client's pooled connection fails too); ``up()``
listens again on the same port. The server behind keeps its data.
"""

from __future__ import annotations

import select
import socket
import struct
import threading


class OutageProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port) while up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._wake: socket.socket | None = None
        self.downs = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        """Listen again (a no-op when up); returns once connections are accepted."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.setblocking(False)
            wake, self._wake = socket.socketpair()
            self._listener = listener
            self._acceptor = threading.Thread(
                target=self._accept, args=(listener, wake), daemon=True
            )
            self._acceptor.start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones (a no-op when down)."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._open = set(self._open), set()
            if listener is None:
                return
            self.downs += 1
            wake, acceptor = self._wake, self._acceptor
        # the acceptor closes its listener itself: a listener closed by another thread while
        # the acceptor is in accept() can leave it blocked on a reused descriptor for ever
        assert wake is not None and acceptor is not None
        wake.send(b"x")
        acceptor.join()
        wake.close()
        for conn in conns:
            try:  # a reset, not an orderly close
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:  # already closed by its pump
                continue
            _kill(conn)

    def __enter__(self) -> OutageProxy:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _accept(self, listener: socket.socket, wake: socket.socket) -> None:
        """Accept until ``wake`` is written to; then close the listener (this thread is the
        only one that touches it)."""
        poll = select.poll()
        poll.register(listener, select.POLLIN)
        poll.register(wake, select.POLLIN)
        try:
            while True:
                events = dict(poll.poll())
                if wake.fileno() in events:
                    return
                try:
                    client, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                client.setblocking(True)
                self._forward(listener, client)
        finally:
            _kill(listener)
            wake.close()

    def _forward(self, listener: socket.socket, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            _kill(client)
            return
        with self._lock:
            if self._listener is not listener:  # went down meanwhile
                _kill(client)
                _kill(server)
                return
            self._open |= {client, server}
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    _kill(src)
    _kill(dst)


def _kill(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
