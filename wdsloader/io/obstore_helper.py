"""obstore for the reads of a process that will fork: served by a forked helper process.

obstore's runtime does not survive a fork (a process forked after obstore made a request in its
parent hangs at its first request, even through a store of its own). A main process that forks
DataLoader workers still reads a few files before they start: the manifest, the listing of the
shard check, the indexes. :class:`HelperFiles` serves these with obstore in a helper process
forked for them (obstore's runtime starts there, never in the main process), so the main
process neither starts obstore nor sets up s3fs/aiobotocore/botocore (about a second at the
first batch), and the workers it forks later start obstore of their own.

The helper is forked on the first call; it inherits the root and the options (its credentials
never cross the pipe), answers the calls of the main process's threads concurrently, and exits
once idle for :data:`IDLE_S` seconds (the next call forks another) or when the main process
goes. The pipe carries JSON headers and the bytes read (no pickle). Errors come back as the
Python errors :class:`~wdsloader.io.obstore_files.ObstoreFiles` raises (what
:mod:`wdsloader.io.transient` classifies); a helper that dies fails its calls with
``ConnectionError`` (transient: retried under the deadline by a new helper).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import ssl
import struct
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fsspec.core import split_protocol

from wdsloader.io.obstore_files import ObjectStoreError, ObstoreFiles

__all__ = ["IDLE_S", "HelperFiles"]

IDLE_S = 1.0  # a helper with no call for this long exits (the next call forks another)
_HELPER_THREADS = 128  # calls answered at once (the index reads' concurrency)
_FRAME = struct.Struct("!IQ")  # header length, body length
_ERRORS: dict[str, type[BaseException]] = {
    e.__name__: e
    for e in (
        FileNotFoundError,
        PermissionError,
        TimeoutError,
        ConnectionRefusedError,
        ConnectionResetError,
        ConnectionError,
        OSError,
    )
}
_clients: weakref.WeakSet[HelperFiles] = weakref.WeakSet()


def _send(sock: socket.socket, header: dict[str, Any], body: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(_FRAME.pack(len(head), len(body)) + head + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    frame = _recv_exact(sock, _FRAME.size)
    if frame is None:
        return None
    head_len, body_len = _FRAME.unpack(frame)
    head = _recv_exact(sock, head_len)
    body = _recv_exact(sock, body_len) if body_len else b""
    if head is None or body is None:
        return None
    return json.loads(head), body


def _error_header(exc: BaseException) -> dict[str, Any]:
    kind = type(exc).__name__
    out: dict[str, Any] = {"type": kind, "message": str(exc)}
    if isinstance(exc, OSError):
        out["errno"], out["message"] = exc.errno, exc.strerror or str(exc)
    for attr in ("status", "code"):
        out[attr] = getattr(exc, attr, None)
    return out


def _rebuilt(err: dict[str, Any]) -> BaseException:
    """The error the helper's call raised, rebuilt in the main process."""
    kind, message = str(err.get("type")), str(err.get("message"))
    if kind == "SSLCertVerificationError":
        return ssl.SSLCertVerificationError(1, message)
    if kind in _ERRORS:
        number = err.get("errno")
        cls = _ERRORS[kind]
        return cls(number, message) if number is not None else cls(message)
    if kind == "ObjectStoreError":
        return ObjectStoreError(message, err.get("status"), err.get("code"))
    return ObjectStoreError(f"{kind}: {message}", err.get("status"), err.get("code"))


def _serve(sock: socket.socket, root: str, options: Any) -> None:
    """The helper's loop: answers each call on a thread of its own, exits when the main
    process closes its end or after :data:`IDLE_S` seconds with no call in flight."""
    files = ObstoreFiles(root, options)
    write = threading.Lock()
    busy = [0]

    def answer(header: dict[str, Any]) -> None:
        body, reply = b"", {"id": header["id"]}
        try:
            op = header["op"]
            if op == "cat":
                body = files.cat_file(header["path"], header.get("start"), header.get("end"))
            elif op == "info":
                reply["result"] = files.info(header["path"])
            else:
                reply["result"] = files.ls(header["path"])
        except Exception as exc:  # sent back to the caller, raised there
            reply["error"], body = _error_header(exc), b""
        with write:
            busy[0] -= 1
            _send(sock, reply, body)

    with ThreadPoolExecutor(_HELPER_THREADS, "wdsloader-obstore-helper") as pool:
        while True:
            if not select.select([sock], [], [], IDLE_S)[0]:
                with write:
                    if busy[0]:
                        continue
                    _send(sock, {"id": -1, "bye": True})  # calls sent since are sent again
                return
            got = _recv(sock)
            if got is None:
                return
            with write:
                busy[0] += 1
            pool.submit(answer, got[0])


class HelperFiles:
    """The files under an ``s3://`` root, read through obstore in a forked helper process,
    with the calls of :class:`~wdsloader.io.obstore_files.ObstoreFiles` (see the module
    docstring); paths are relative to the root."""

    protocol = "s3"
    async_impl = False

    def __init__(self, root: str, options: Any) -> None:
        self._root, self._options = root, options
        bucket, _, prefix = (split_protocol(root)[1] or "").strip("/").partition("/")
        self._shown = repr(f"s3://{bucket}/{prefix}".rstrip("/"))
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._helper: int | None = None
        # each call not answered yet: its header, its future, the pipe it was sent on
        self._pending: dict[int, tuple[dict[str, Any], Future[Any], socket.socket]] = {}
        self._next = 0
        self._pid = os.getpid()
        self.forks = 0  # helpers started (for tests)
        _clients.add(self)

    def __repr__(self) -> str:
        return f"HelperFiles({self._shown})"  # never the options (their keys)

    def __reduce__(self) -> Any:
        raise TypeError(f"{self!r} is not pickled (it is rebuilt in each process)")

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (to its end when ``end`` is None or past it)."""
        result: bytes = self._call({"op": "cat", "path": path, "start": start, "end": end})
        return result

    def info(self, path: str) -> dict[str, Any]:
        """``{"name", "size", "type"}`` of ``path`` (one HEAD request)."""
        result: dict[str, Any] = self._call({"op": "info", "path": path})
        return result

    def ls(self, path: str, detail: bool = True) -> list[dict[str, Any]]:
        """The files directly under the folder ``path`` (``""``: the root)."""
        result: list[dict[str, Any]] = self._call({"op": "ls", "path": path})
        return result

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing to do: listings are not cached."""

    def close(self) -> None:
        """Ask the helper to exit (it also exits when idle, or when this process goes)."""
        with self._lock:
            self._drop_helper()

    def _call(self, header: dict[str, Any]) -> Any:
        if self._pid != os.getpid():
            raise RuntimeError(f"{self!r} belongs to the process that made it")
        done: Future[Any] = Future()
        with self._lock:
            self._next += 1
            header = {**header, "id": self._next}
            self._submit(header, done)
        deadline = self._options.deadline
        try:
            return done.result(deadline)
        except TimeoutError:
            if done.done():
                raise  # the helper's answer: a timeout of its request
        # a helper with no answer by the deadline is stuck: killed (its other calls fail as
        # transient, and are retried by a new one)
        with self._lock:
            self._pending.pop(header["id"], None)
            if self._helper is not None:
                os.kill(self._helper, signal.SIGKILL)
                self._drop_helper()  # the next call forks another
        raise TimeoutError(
            errno.ETIMEDOUT, f"{self!r}: no answer from the obstore helper in {deadline} s"
        )

    def _submit(self, header: dict[str, Any], done: Future[Any]) -> None:
        """Send a call (the lock held), forking a helper if none runs."""
        if self._sock is None:
            self._fork()
        assert self._sock is not None
        self._pending[header["id"]] = (header, done, self._sock)
        try:
            _send(self._sock, header)
        except OSError:
            pass  # the helper went: its reader fails or re-sends the pending calls

    def _fork(self) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the helper: never returns to the caller's code
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's
                ours.close()
                _serve(theirs, self._root, self._options)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.forks += 1
        self._sock, self._helper = ours, pid
        reader = threading.Thread(
            target=self._read_answers, args=(ours, pid), name="wdsloader-helper-reader", daemon=True
        )
        reader.start()

    def _read_answers(self, sock: socket.socket, pid: int) -> None:
        """Deliver the helper's answers; when it goes, re-send (it said goodbye: idle) or
        fail (it died) the calls it did not answer."""
        bye = False
        while True:
            try:
                got = _recv(sock)
            except OSError:
                got = None
            if got is None or got[0].get("bye"):
                bye = got is not None
                break
            header, body = got
            with self._lock:
                _, done, _ = self._pending.pop(int(header["id"]), (None, None, None))
            if done is None:
                continue
            if "error" in header:
                done.set_exception(_rebuilt(header["error"]))
            else:
                done.set_result(body if "result" not in header else header["result"])
        with self._lock:
            if self._sock is sock:
                self._drop_helper()
            ours = {k: v for k, v in self._pending.items() if v[2] is sock}
            for key in ours:
                del self._pending[key]
            if bye:  # idle: the calls it did not read go to a new helper
                for header, done, _ in ours.values():
                    self._submit(header, done)
                return
        for _, done, _ in ours.values():
            gone = f"{self!r}: the obstore helper process exited"
            done.set_exception(ConnectionError(errno.ECONNRESET, gone))

    def _drop_helper(self) -> None:
        """Close the pipe and reap the helper (the lock held)."""
        sock, pid, self._sock, self._helper = self._sock, self._helper, None, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the helper and our reader see its end now
            except OSError:
                pass
            sock.close()
        if pid is not None:
            threading.Thread(target=_reap, args=(pid,), daemon=True).start()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _forget_in_child() -> None:
    """A forked process (a DataLoader worker, a helper) closes its copies of the pipes: a
    helper then exits when its own main process goes."""
    for client in list(_clients):
        sock, client._sock, client._helper = client._sock, None, None
        client._pending = {}
        if sock is not None:
            sock.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
