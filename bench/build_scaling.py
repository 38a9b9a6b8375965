"""How ``build_shards`` scales with workers, and its speed per core against the peers' writers.

Workloads (from :mod:`bench.workloads`): ``embed`` (~9.4 KB: three float32 arrays, an int label,
a JSON field) and ``blobs`` (160 KiB of bytes, a label, a JSON field). Every system gets the
same samples, generated into a list before its timed run (so generation is not measured):

- ``ours w=1`` / ``ours w=2``: ``build_shards(list, workers=...)`` with the default block size;
- ``ours+map w=1`` / ``ours+map w=2``: the same with a ``map`` that spins ~50 µs per sample
  (a source that costs time per sample);
- ``webdataset``: ``webdataset.ShardWriter`` (``.npy``/``.bin`` + ``.cls`` + ``.json``);
- ``mosaic``: MosaicML's ``MDSWriter`` (ndarray/bytes columns + int + json).

Runs are interleaved (``--repeats`` rounds of every system), each writing to a fresh folder
under ``--tmp``. Printed per system: median samples/s (wall), median samples per CPU-second
(this process and its worker processes: the per-core speed), and ratios. Run from the
repository root, with the peers' writers importable (``--systems`` names a subset otherwise):

    PYTHONPATH=$PWD python bench/build_scaling.py [--workloads embed blobs] [--repeats 3]
        [--embed-n 20480] [--blobs-n 3072] [--shard-mb 64]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import systems, workloads

MAP_US = 50.0  # the cost of the slow map per sample


def slow_map(sample: dict[str, Any]) -> dict[str, Any]:
    """A ``map`` that spins ~50 µs (module level: workers unpickle it by reference)."""
    end = time.perf_counter() + MAP_US * 1e-6
    while time.perf_counter() < end:
        pass
    return sample


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def _ours(workers: int, slow: bool) -> Callable[[str, int, str, int], Any]:
    def setup(workload: str, n: int, out: str, shard_bytes: int) -> Callable[[], None]:
        from build_shards import build_shards

        samples = [workloads.sample(workload, i) for i in range(n)]

        def run() -> None:
            build_shards(
                samples, out, shard_max_bytes=shard_bytes, workers=workers,
                map=slow_map if slow else None,
            )  # fmt: skip

        return run

    return setup


def _webdataset(workload: str, n: int, out: str, shard_bytes: int) -> Callable[[], None]:
    import webdataset as wds

    samples = [systems.wds_sample(workload, i) for i in range(n)]

    def run() -> None:
        os.makedirs(out)
        pattern = os.path.join(out, "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=10**9, maxsize=shard_bytes, verbose=0) as sink:
            for s in samples:
                sink.write(s)

    return run


def _mosaic(workload: str, n: int, out: str, shard_bytes: int) -> Callable[[], None]:
    streaming = systems.import_mosaic()
    wl = workloads.WORKLOADS[workload]
    columns = {
        f.name: f"ndarray:{f.dtype}:{','.join(map(str, f.shape))}" if f.kind == "npy" else "bytes"
        for f in wl.fields
    }
    columns.update(label="int", meta="json")
    samples = [{**workloads.arrays(workload, i), **workloads.extras(workload, i)} for i in range(n)]

    def run() -> None:
        with streaming.MDSWriter(out=out, columns=columns, size_limit=shard_bytes) as sink:
            for s in samples:
                sink.write(s)

    return run


SYSTEMS: dict[str, Callable[[str, int, str, int], Callable[[], None]]] = {
    "ours w=1": _ours(1, False),
    "ours w=2": _ours(2, False),
    "ours+map w=1": _ours(1, True),
    "ours+map w=2": _ours(2, True),
    "webdataset": _webdataset,
    "mosaic": _mosaic,
}


def measure(system: str, workload: str, n: int, tmp: str, shard_bytes: int) -> tuple[float, float]:
    """``(samples/s wall, samples per CPU-second)`` of one write of ``n`` samples."""
    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    run = SYSTEMS[system](workload, n, out, shard_bytes)
    gc.collect()
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    run()
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    del run
    shutil.rmtree(out, ignore_errors=True)
    return n / wall, n / max(cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=["embed", "blobs"])
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--embed-n", type=int, default=20_480)
    parser.add_argument("--blobs-n", type=int, default=3_072)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--tmp", default=None, help="folder for the outputs (default: a temp dir)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-build-scaling-", dir=args.tmp)
    shard_bytes = args.shard_mb * 2**20
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} repeats={args.repeats}")
    try:
        for workload in args.workloads:
            n = args.embed_n if workload == "embed" else args.blobs_n
            got: dict[str, list[tuple[float, float]]] = {s: [] for s in args.systems}
            for _ in range(args.repeats):  # interleaved: load changes hit every system
                for system in args.systems:
                    got[system].append(measure(system, workload, n, tmp, shard_bytes))
            print(f"\n{workload}: n={n}, shard {args.shard_mb} MiB, load {os.getloadavg()[0]:.1f}")
            wall = {s: statistics.median(r[0] for r in v) for s, v in got.items()}
            cpu = {s: statistics.median(r[1] for r in v) for s, v in got.items()}
            for s in args.systems:
                runs = " ".join(f"{r[0]:,.0f}" for r in got[s])
                print(
                    f"  {s:<14} {wall[s]:9,.0f} samples/s  {cpu[s]:9,.0f} samples/CPU-s"
                    f"  (runs: {runs})"
                )
            for a, b in (("ours w=2", "ours w=1"), ("ours+map w=2", "ours+map w=1")):
                if a in wall and b in wall:
                    print(f"  {a} / {b}: {wall[a] / wall[b]:.2f}x wall")
            for peer in ("webdataset", "mosaic"):
                if peer in cpu and "ours w=1" in cpu:
                    print(
                        f"  ours w=1 / {peer}: {cpu['ours w=1'] / cpu[peer]:.2f}x per CPU-s, "
                        f"{wall['ours w=1'] / wall[peer]:.2f}x wall"
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
