"""Build throughput: samples/s of ``build_shards`` on generated embedding samples.

Each sample: ``question_emb`` float32[384], ``negatives`` float32[4, 384] and a small ``meta``
dict. The source is a torch map-style dataset that generates sample ``i`` from ``i`` (so worker
processes read their own blocks); the output is a local folder. Run:

    .venv/bin/python bench/build_throughput.py --samples 50000 --workers 1 2
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import torch.utils.data

from build_shards import build_shards

DIM = 384
N_NEG = 4


class GeneratedEmbeddings(torch.utils.data.Dataset):
    """Deterministic synthetic embedding samples: sample ``i`` depends only on ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        vecs = rng.standard_normal((1 + N_NEG, DIM), dtype=np.float32)
        return {
            "question_emb": vecs[0],
            "negatives": vecs[1:],
            "meta": {"id": i, "source": "synthetic", "difficulty": round(float(i % 7) / 7, 3)},
        }


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the build's workers)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shard-max-count", type=int, default=2_000)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--out", default=None, help="parent folder for the outputs (default: tmp)")
    args = parser.parse_args()

    base = args.out or tempfile.mkdtemp(prefix="bench-build-")
    source = GeneratedEmbeddings(args.samples)
    t0 = time.perf_counter()
    for i in range(min(args.samples, 2_000)):
        source[i]
    gen_rate = min(args.samples, 2_000) / (time.perf_counter() - t0)
    print(
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} samples={args.samples} "
        f"shard_max_count={args.shard_max_count}"
    )
    print(f"generating samples alone: {gen_rate:,.0f} samples/s (one process)")
    digests = []
    for workers in args.workers:
        out = os.path.join(base, f"w{workers}")
        shutil.rmtree(out, ignore_errors=True)
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        manifest = build_shards(
            source,
            out,
            splits={"train": 0.9, "val": 0.1},
            shard_max_count=args.shard_max_count,
            block_size=args.block_size,
            workers=workers,
        )
        elapsed = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0
        mb = manifest.num_bytes / 1e6
        shards = sum(len(s.shards) for s in manifest.splits.values())
        print(
            f"workers={workers}: {elapsed:6.2f} s  {manifest.num_samples / elapsed:9,.0f} samples/s"
            f"  {mb / elapsed:7.1f} MB/s  cpu {cpu:5.1f} s  ({mb:,.0f} MB in {shards} shards)"
        )
        digests.append([s.sha256 for split in manifest.splits.values() for s in split.shards])
    if len(digests) > 1:
        print("shards identical across worker counts:", all(d == digests[0] for d in digests))
    if args.out is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
