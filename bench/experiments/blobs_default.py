"""Undeclared ``.bin`` blobs (160 KiB + an int label, no schema) read with the default settings
at ``num_workers=0``, against a warm ``readinto`` loop over the same shard files (the ceiling).

    PYTHONPATH=$PWD python bench/experiments/blobs_default.py [--n 2000] [--repeats 3]

Prints samples/s (best of ``--repeats``, interleaved) of the loader and of the raw loop, the
loader's share of the raw loop, the loader's minor page faults per sample (its best pass), the
value type of the blob and whether every batch took the whole-batch path (``loader.stats``),
and ``uptime`` (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time

import numpy as np

BLOB = 160 * 1024


def build(path: str, n: int, variable: bool) -> None:
    from build_shards import build_shards

    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, BLOB + 4096, dtype=np.uint8).tobytes()

    def items():  # type: ignore[no-untyped-def]
        for i in range(n):
            size = BLOB - (i % 7) * 512 if variable else BLOB
            yield {
                "__key__": f"{i:06d}",
                "audio.bin": pool[i % 4096 : i % 4096 + size],
                "label": i % 10,
            }

    build_shards(items(), path)


def shard_files(path: str) -> list[str]:
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".tar")
    )


def raw_loop(files: list[str], batch_bytes: int) -> int:
    """Read every file 1 MiB at a time into a ring of 4 faulted-in batch-sized arrays."""
    pool = [np.ones(batch_bytes + 2**20, dtype=np.uint8) for _ in range(4)]
    k = pos = total = 0
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while True:
                got = f.readinto(memoryview(pool[k])[pos : pos + 2**20])
                if not got:
                    break
                total += got
                pos += got
                if pos >= batch_bytes:
                    k, pos = (k + 1) % len(pool), 0
    return total


def main() -> None:
    from wdsloader import create_loader

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variable", action="store_true")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wdsl-bytes-blobs"))
    args = p.parse_args()
    path = os.path.join(args.data, f"n{args.n}{'-var' if args.variable else ''}")
    if not os.path.exists(path):
        build(path, args.n, args.variable)
    files = shard_files(path)
    total = sum(os.path.getsize(f) for f in files)
    raw_loop(files, 64 * total // args.n)  # warm the page cache
    best_raw = best = per = 0.0
    kind = ""
    whole = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        raw_loop(files, 64 * total // args.n)
        best_raw = max(best_raw, args.n / (time.perf_counter() - t))
        loader = create_loader(path, "train", 64, 0, drop_last=False, shuffle=False)
        t, faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        count = 0
        for batch in loader:
            count += len(batch["label"])
            kind = type(batch["audio"]).__name__ + "/" + type(batch["audio"][0]).__name__
        rate = count / (time.perf_counter() - t)
        if rate > best:
            best = rate
            per = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / count
        whole = dict(loader.stats)
    print(
        f"loader {best:8.0f} samples/s  raw readinto {best_raw:8.0f} samples/s  "
        f"share {100 * best / best_raw:5.1f}%  faults/sample {per:.1f}  value {kind}"
    )
    print("stats", {k: v for k, v in (whole or {}).items() if "batch" in k or "parsed" in k})
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
