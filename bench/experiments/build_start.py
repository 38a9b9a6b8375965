"""What starting build workers costs: the bench's embeddings built from its torch map-style
Dataset, each build in a fresh process, with 1 and with 2 workers, at two sizes.

    PYTHONPATH=$PWD .venv-bench/bin/python bench/experiments/build_start.py [N1 N2 ...] [--workload embed]

Prints each build's wall time, and from the two largest sizes the fixed start of the 2-worker
build and its rate once started (a line through the two points).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_once(workload: str, n: int, workers: int, out: str) -> float:
    """One build in this process; its wall seconds."""
    from bench.torch_source import GeneratedTorchDataset
    from build_shards import build_shards

    t = time.perf_counter()
    build_shards(
        GeneratedTorchDataset(workload, n),
        out,
        shard_max_bytes=64 * 2**20,
        shard_max_count=6000,
        workers=workers,
    )
    return time.perf_counter() - t


def fresh(workload: str, n: int, workers: int, tmp: str) -> float:
    """One build in a fresh process (torch imported first, as a training script has it)."""
    out = os.path.join(tmp, f"{workload}-{n}-{workers}")
    code = (
        "import json, sys, torch\n"
        "from bench.experiments.build_start import build_once\n"
        "if __name__ == '__main__':\n"
        f"    print(json.dumps(build_once({workload!r}, {n}, {workers}, {out!r})))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    )
    shutil.rmtree(out, ignore_errors=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[20480, 81920])
    parser.add_argument("--workload", default="embed")
    args = parser.parse_args()
    walls: dict[tuple[int, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            for workers in (1, 2):
                walls[n, workers] = wall = fresh(args.workload, n, workers, tmp)
                print(f"n={n:7d} workers={workers}: {wall:6.2f} s wall, {n / wall:9,.0f} samples/s")
            print(f"          2 workers / 1 worker: {walls[n, 1] / walls[n, 2]:.2f}x")
    if len(args.sizes) >= 2:
        a, b = sorted(args.sizes)[-2:]
        rate = (b - a) / (walls[b, 2] - walls[a, 2])
        start = walls[a, 2] - a / rate
        one = (b - a) / (walls[b, 1] - walls[a, 1])
        print(
            f"2 workers: start {start:.2f} s, then {rate:,.0f} samples/s "
            f"({rate / one:.2f}x one worker's {one:,.0f})"
        )


if __name__ == "__main__":
    main()
