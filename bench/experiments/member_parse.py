"""Tar member parsing per thread: our member walk on our own shards (plain ustar) and on
webdataset ``ShardWriter`` shards (a PAX header before every member), Python's ``tarfile`` on
both, and what adopt's scan and the loader's per-sample parser make of them.

    PYTHONPATH=$PWD:/work/noedit .venv/bin/python bench/experiments/member_parse.py [--n 4096]
        [--repeats 5] [--old TREE]

Writes ``--n`` samples of the ``embed`` workload (three ``.npy`` arrays, a ``.cls`` label and
JSON: 5 members per sample) with webdataset's ``ShardWriter`` (one shard), and the same members
with our ``TarStreamWriter``; loads both into memory and times members per CPU-second of one
thread (best of ``--repeats``) for:

- ``iter_members`` over the whole shard (bytes; and a numpy buffer, which is what the loader
  reads into),
- ``iter_samples`` (members grouped into samples: what adopt and ``scan_tar`` walk),
- adopt's scan of one shard (``scan_buffer``: the walk, ``.npy`` headers, key hashes, layout
  and the file's SHA-256),
- ``parse_sample`` over each sample's byte range (the loader's per-sample path),
- ``tarfile`` iterating the members of the shard.

``--old TREE`` runs the same measurements with ``TREE`` first on the path (the code before a
change: ``git archive main | tar -x -C /tmp/old``), in alternation with this tree, and adds the
ratio. Each tree runs in its own process (this file, given ``--measure``), so both import their
own ``wdsloader``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROWS = [
    ("iter_members", "plain", "iter_members, whole shard (bytes)"),
    ("iter_members", "pax", "iter_members, whole shard (bytes)"),
    ("iter_members_np", "pax", "iter_members, whole shard (numpy buffer)"),
    ("iter_samples", "plain", "iter_samples (members grouped by key)"),
    ("iter_samples", "pax", "iter_samples (members grouped by key)"),
    ("adopt_scan", "plain", "adopt scan of one shard (scan_buffer, with SHA-256)"),
    ("adopt_scan", "pax", "adopt scan of one shard (scan_buffer, with SHA-256)"),
    ("parse_sample", "plain", "parse_sample per sample (the loader's per-sample path)"),
    ("parse_sample", "pax", "parse_sample per sample (the loader's per-sample path)"),
    ("tarfile", "plain", "tarfile, iterating the members"),
    ("tarfile", "pax", "tarfile, iterating the members"),
]
SHARDS = {"plain": "ours.tar", "pax": "webdataset.tar"}
SHARD_TITLES = {"plain": "ours (plain ustar)", "pax": "webdataset ShardWriter (PAX)"}


# -- writing (the parent process) ----------------------------------------------------------------
def write_shards(n: int, out: str) -> int:
    """The webdataset shard of ``n`` embed samples and ours with the same members; returns the
    number of members in each."""
    import webdataset as wds

    from bench.systems import wds_sample
    from wdsloader.format import TarStreamWriter

    pattern = os.path.join(out, "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=10**9, maxsize=10**12, verbose=0) as sink:
        for i in range(n):
            sink.write(wds_sample("embed", i))
    os.rename(pattern % 0, os.path.join(out, SHARDS["pax"]))
    samples: dict[str, list[tuple[str, bytes]]] = {}
    with tarfile.open(os.path.join(out, SHARDS["pax"])) as tf:
        for info in tf:
            key, ext = info.name.split(".", 1)
            f = tf.extractfile(info)
            assert f is not None
            samples.setdefault(key, []).append((ext, f.read()))
    with open(os.path.join(out, SHARDS["plain"]), "wb") as f:
        writer = TarStreamWriter(f)
        for key, members in samples.items():
            writer.write_sample(key, members)
        writer.close()
    return sum(len(m) for m in samples.values())


# -- measuring (a child process per tree) --------------------------------------------------------
def _jobs(data: bytes) -> dict[str, Callable[[], int]]:
    """Each measured job over one shard's bytes; a job returns the members it saw."""
    import numpy as np

    from build_shards.adopt.scan import scan_buffer
    from wdsloader.decode import parse_sample
    from wdsloader.format import iter_members, iter_samples, scan_tar

    offsets, _ = scan_tar(data)
    ranges = list(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True))
    array = np.frombuffer(data, dtype=np.uint8).copy()

    def walk() -> int:
        return sum(1 for _ in iter_members(data))

    def walk_np() -> int:
        return sum(1 for _ in iter_members(memoryview(array)))

    def samples() -> int:
        return sum(len(fields) for _, _, fields in iter_samples(data))

    def scan() -> int:
        got = scan_buffer(data, path="x.tar", source="x.tar")
        return got.num_samples * len(next(iter(got.ext_sets)))

    def per_sample() -> int:
        view = memoryview(array)
        return sum(len(parse_sample(view, a, b)[1]) for a, b in ranges)

    def with_tarfile() -> int:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            return sum(1 for _ in tf)

    return {
        "iter_members": walk,
        "iter_members_np": walk_np,
        "iter_samples": samples,
        "adopt_scan": scan,
        "parse_sample": per_sample,
        "tarfile": with_tarfile,
    }


def measure(folder: str, repeats: int) -> dict[str, float]:
    """``"job/shard" -> members per CPU-second``, best of ``repeats``."""
    out: dict[str, float] = {}
    for shard, name in SHARDS.items():
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        jobs = _jobs(data)
        for job, row_shard, _ in ROWS:
            if row_shard != shard:
                continue
            best = float("inf")
            for _ in range(repeats):
                t0 = time.process_time()
                count = jobs[job]()
                best = min(best, time.process_time() - t0)
            out[f"{job}/{shard}"] = count / best
    return out


def run_tree(tree: str, folder: str, repeats: int) -> dict[str, float]:
    """:func:`measure` in a new process with ``tree`` first on the path."""
    paths = [tree, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", folder]
    proc = subprocess.run(
        [*cmd, "--repeats", str(repeats)], env=env, check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def report(n: int, members: int, trees: dict[str, dict[str, float]]) -> None:
    names = list(trees)
    print(f"{n} samples, {members} members per shard; members per CPU-second of one thread")
    print("(best of the rounds)\n")
    head = "| job | shard | " + " | ".join(f"{t} members/s | {t} us/member" for t in names)
    ratio = len(names) == 2
    print(head + (f" | {names[0]} / {names[1]} |" if ratio else " |"))
    print("|---|---|" + "---|---|" * len(names) + ("---|" if ratio else ""))
    for job, shard, title in ROWS:
        key = f"{job}/{shard}"
        cells = [f"{trees[t][key]:,.0f} | {1e6 / trees[t][key]:.2f}" for t in names]
        line = f"| {title} | {SHARD_TITLES[shard]} | " + " | ".join(cells)
        if ratio:
            line += f" | {trees[names[0]][key] / trees[names[1]][key]:.2f}x"
        print(line + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="samples per shard")
    p.add_argument("--repeats", type=int, default=5, help="timed runs (best of)")
    p.add_argument("--old", metavar="TREE", help="also measure this source tree (before)")
    p.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.repeats)))
        return
    with tempfile.TemporaryDirectory(prefix="member-parse-") as folder:
        members = write_shards(args.n, folder)
        trees = {"new": ROOT} if not args.old else {"new": ROOT, "old": args.old}
        best: dict[str, dict[str, Any]] = {t: {} for t in trees}
        rounds = max(1, args.repeats // 2)  # alternate the trees, 2 timed runs per round
        for _ in range(rounds):
            for t, tree in trees.items():
                got = run_tree(tree, folder, min(2, args.repeats))
                for key, rate in got.items():
                    best[t][key] = max(rate, best[t].get(key, 0.0))
        report(args.n, members, best)


if __name__ == "__main__":
    main()
