"""Byte ranges of shards: the requests, their merging per shard, and preads of local files."""

from __future__ import annotations

import os

from wdsloader.format import ShardInfo
from wdsloader.io.retry import truncated
from wdsloader.plan.coalesce import coalesce

Request = tuple[ShardInfo, int, int]  # (shard, start, stop): bytes [start, stop) of the shard


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


def pread_into(fd: int, out: memoryview, start: int, url: str) -> None:
    """Fill ``out`` with the bytes of an open file from ``start`` (see :func:`pread`)."""
    done = 0
    while done < len(out):
        n = os.preadv(fd, [out[done:]], start + done)
        if not n:
            raise truncated(url, start + done)
        done += n
