"""A large joined local read is cut in two halves of equal bytes, one read on the store's pool
thread and one on the caller's, whatever the sizes of its requests: the bytes are those of a
read in one piece."""

from __future__ import annotations

import os
import threading
from collections import Counter

import numpy as np

from wdsloader.format import Manifest
from wdsloader.io import file_store
from wdsloader.io.file_store import LocalStore
from wdsloader.io.ranges import Hole, Job, halve_jobs, preadv_all

DATA = bytes((i * 7 + i // 251) % 256 for i in range(200_000))
# (file offset, piece sizes; negative: a hole) of each job: small ones, a huge one with a hole
# in it, a small one
SHAPES = [(0, [30]), (100, [20, 50]), (1_000, [90_000, -5_000, 60_000]), (190_000, [7])]


def _jobs(fd: int, out: np.ndarray) -> list[Job]:
    jobs, pos = [], 0
    for start, sizes in SHAPES:
        pieces: list = []
        for n in sizes:
            pieces.append(Hole(-n) if n < 0 else memoryview(out)[pos : pos + n])
            pos += abs(n)
        jobs.append((fd, pieces, start, "f"))
    return jobs


def _read(part: list[Job]) -> int:
    return sum(len(p) for _, pieces, _, _ in part for p in pieces if not isinstance(p, Hole))


def test_very_unequal_jobs_are_halved_by_bytes_and_read_the_same_bytes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(DATA)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = sum(abs(n) for _, sizes in SHAPES for n in sizes)
        whole, halves = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
        for job in _jobs(fd, whole):
            preadv_all(*job)
        head, tail = halve_jobs(_jobs(fd, halves))
        assert [_read(head), _read(tail)] == [75_053, 75_054]  # 150,107 read, the hole not
        assert [len(head), len(tail)] == [3, 2]  # the huge job cut inside its first piece
        assert tail[0][2] == 1_000 + 75_053 - 100  # where its second part starts in the file
        for job in tail + head:
            preadv_all(*job)
        assert halves.tobytes() == whole.tobytes()
        assert whole[100 + 90_000 : 100 + 95_000].sum() == 0  # the hole: not read
    finally:
        os.close(fd)


def test_a_joined_read_of_unequal_requests_reads_half_the_bytes_on_each_thread(
    tmp_path, monkeypatch
):
    from build_shards import build_shards

    root = str(tmp_path / "ds")
    rows = [{"__key__": f"s{i:03d}", "blob.bin": DATA[: 1_000 * (i + 1)]} for i in range(40)]
    build_shards(rows, root)
    shard = Manifest.load(root).split("train").shards[0]
    with open(os.path.join(root, shard.path), "rb") as f:
        data = f.read()
    by_thread: Counter[str] = Counter()
    real = file_store.preadv_all

    def counted(fd, pieces, start, name, url=str):
        by_thread[threading.current_thread().name] += sum(len(p) for p in pieces)
        real(fd, pieces, start, name, url)

    monkeypatch.setattr(file_store, "preadv_all", counted)
    monkeypatch.setattr(file_store, "SPLIT_BYTES", 1_000)
    # 20 requests of 100 bytes, then one of 30,000: split by count, the first thread read 1,000
    reqs = [(shard, 200 * j, 200 * j + 100) for j in range(20)] + [(shard, 5_000, 35_000)]
    store = LocalStore(root)
    joined, _ = store.read_joined(reqs)
    store.close()
    assert bytes(joined) == b"".join(data[s:e] for _, s, e in reqs)
    assert sorted(by_thread.values()) == [16_000, 16_000]
    assert set(by_thread) == {"wdsloader-fetch_0", threading.current_thread().name}
