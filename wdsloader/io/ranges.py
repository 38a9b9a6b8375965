"""Byte ranges of shards: the requests, their merging per shard, and preads of local files."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import cast

from wdsloader.format import ShardInfo
from wdsloader.io.retry import truncated
from wdsloader.plan.coalesce import coalesce

Request = tuple[ShardInfo, int, int]  # (shard, start, stop): bytes [start, stop) of the shard


class Hole:
    """A cut's target that takes nothing: those ``nbytes`` of the range are not read (the read
    buffer keeps whatever it held there; the caller reads them elsewhere)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


Piece = memoryview | Hole
Cut = tuple[int, Piece]  # (offset in a range, buffer or hole): those bytes of the range go there
IOV_MAX = 1024  # buffers one preadv call takes (Linux's UIO_MAXIOV)
Job = tuple[int, Sequence[Piece], int, str]  # descriptor, pieces, file offset, shard path


def unique_shards(reqs: list[Request]) -> dict[str, ShardInfo]:
    """The shards of ``reqs`` by path, in order of first request."""
    out: dict[str, ShardInfo] = {}
    for shard, _, _ in reqs:
        out.setdefault(shard.path, shard)
    return out


def merge_requests(reqs: list[Request]) -> list[tuple[ShardInfo, int, int, list[int]]]:
    """Merge overlapping or adjacent ranges of each shard: ``(shard, start, stop, request ids)``."""
    shards = unique_shards(reqs)
    key_of = {rel: k for k, rel in enumerate(shards)}
    by_key = list(shards.values())
    runs = coalesce(
        [key_of[shard.path] for shard, _, _ in reqs],
        [start for _, start, _ in reqs],
        [stop for _, _, stop in reqs],
    )
    members: list[list[int]] = [[] for _ in range(len(runs.key))]
    for i, run in enumerate(runs.run_of.tolist()):
        members[run].append(i)
    return [
        (by_key[key], start, stop, ids)
        for key, start, stop, ids in zip(
            runs.key.tolist(), runs.start.tolist(), runs.stop.tolist(), members, strict=True
        )
    ]


def pread(fd: int, start: int, stop: int, url: str) -> bytes:
    """Bytes [start, stop) of an open file; a file that ends before ``stop`` is truncated."""
    want = stop - start
    data = os.pread(fd, want, start)
    while len(data) < want:
        more = os.pread(fd, want - len(data), start + len(data))
        if not more:
            raise truncated(url, start + len(data))
        data += more
    return data


def preadv_all(
    fd: int,
    pieces: Sequence[Piece],
    start: int,
    name: str,
    url: Callable[[str], str] = str,
) -> None:
    """Fill ``pieces`` one after the other with the bytes of an open file from ``start``, each
    byte copied once from the file into its piece (``os.preadv``, at most :data:`IOV_MAX`
    pieces a call), the bytes of a :class:`Hole` left unread; a file that ends before they are
    full is truncated (the error names the file ``url(name)``)."""
    if 0 < len(pieces) <= IOV_MAX and not any([type(p) is Hole for p in pieces]):
        # the usual job (a sample's range, its placed rows cut out): one call fills it all
        bufs = cast("Sequence[memoryview]", pieces)
        got = os.preadv(fd, bufs, start)
        if got != sum([len(p) for p in bufs]):
            _preadv_run(fd, bufs, start, name, url, got)
        return
    at, run = start, list[memoryview]()
    for piece in pieces:
        if isinstance(piece, Hole):
            _preadv_run(fd, run, at, name, url)
            at += sum([len(p) for p in run]) + len(piece)
            run = []
        else:
            run.append(piece)
    _preadv_run(fd, run, at, name, url)


def _preadv_run(
    fd: int,
    pieces: Sequence[memoryview],
    start: int,
    name: str,
    url: Callable[[str], str],
    done: int = 0,
) -> None:
    """:func:`preadv_all` of pieces without holes, of which the first ``done`` bytes are read
    already."""
    todo = [p for p in pieces if len(p)]
    i, at, n = 0, start + done, done
    while True:
        while n:  # past the pieces filled, into the one filled in part
            if n < len(todo[i]):
                todo[i], n = todo[i][n:], 0
            else:
                n -= len(todo[i])
                i += 1
        if i == len(todo):
            return
        n = os.preadv(fd, todo if i == 0 and len(todo) <= IOV_MAX else todo[i : i + IOV_MAX], at)
        if not n:
            raise truncated(url(name), at)
        at += n


def split_range(sink: memoryview, cuts: Sequence[Cut]) -> list[Piece]:
    """The buffers that receive one range's bytes in file order: ``sink`` (as long as the
    range), except that bytes ``[off, off + len(buf))`` of the range go to ``buf`` (or nowhere,
    for a :class:`Hole`) for each ``(off, buf)`` of ``cuts`` (sorted, not overlapping, inside
    the range)."""
    out: list[Piece] = []
    pos = 0
    for off, buf in cuts:
        if off < pos or off + len(buf) > len(sink):
            raise ValueError(f"cut [{off}, {off + len(buf)}) overlaps another or the range's end")
        out += [sink[pos:off], buf]
        pos = off + len(buf)
    out.append(sink[pos:])
    return out


def halve_jobs(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """``jobs`` (:func:`preadv_all` arguments) in two parts that read equal bytes (to one; the
    bytes of holes are not read), in order: the job where the middle byte falls is cut there,
    its first pieces (the piece at the cut sliced) a job of the first part, the rest one of
    the second."""
    sizes = [sum([len(p) for p in pieces if type(p) is not Hole]) for _, pieces, _, _ in jobs]
    left = sum(sizes) // 2
    first: list[Job] = []
    for k, (fd, pieces, start, name) in enumerate(jobs):
        size = sizes[k]
        if size <= left:
            first.append(jobs[k])
            left -= size
            continue
        head: list[Piece] = []
        tail: list[Piece] = []
        for piece in pieces:
            if not left:
                tail.append(piece)
            elif isinstance(piece, Hole) or len(piece) <= left:
                head.append(piece)
                left -= 0 if isinstance(piece, Hole) else len(piece)
            else:
                head.append(piece[:left])
                tail.append(piece[left:])
                left = 0
        if head:
            first.append((fd, head, start, name))
        at = start + sum(len(p) for p in head)
        return first, [(fd, tail, at, name), *jobs[k + 1 :]]
    return first, []
