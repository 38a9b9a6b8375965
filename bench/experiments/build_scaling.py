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
(this process and its worker processes: the per-core speed), the median CPU seconds of the
parent process (with its threads) and of the worker processes apart (what the parent does
while workers run), and ratios. ``--pin`` runs the 2-worker systems on 2 cores and every other
system on 1 (a fair 2-vs-1 comparison on a machine where other work takes cores). Run from the
repository root, with the peers' writers importable (``--systems`` names a subset otherwise):

    PYTHONPATH=$PWD python bench/experiments/build_scaling.py [--workloads embed blobs] [--repeats 3]
        [--embed-n 20480] [--blobs-n 3072] [--shard-mb 64] [--pin]
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
from dataclasses import dataclass
from typing import Any

from bench import systems, workloads

MAP_US = 50.0  # the cost of the slow map per sample


def slow_map(sample: dict[str, Any]) -> dict[str, Any]:
    """A ``map`` that spins ~50 µs (module level: workers unpickle it by reference)."""
    end = time.perf_counter() + MAP_US * 1e-6
    while time.perf_counter() < end:
        pass
    return sample


def _live_children_cpu() -> float:
    """CPU seconds (user + system) of this process's live child processes and of the children
    they reaped: a fork server's workers are its children, not this process's, so
    ``RUSAGE_CHILDREN`` never counts them (Linux ``/proc``; 0 elsewhere)."""
    me, total = os.getpid(), 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid; then utime, stime, cutime, cstime (fields 14-17)
            total += sum(int(v) for v in fields[11:15]) / tick
    return total


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process (with its threads), and of its child
    processes: ended ones, live ones and what those reaped (a fork server's workers)."""
    self_ = resource.getrusage(resource.RUSAGE_SELF)
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    ended = child.ru_utime + child.ru_stime
    return self_.ru_utime + self_.ru_stime, ended + _live_children_cpu()


def _cores(system: str, pin: bool) -> set[int] | None:
    """The cores a system may run on with ``--pin``: every core for a 2-worker run, the first
    one for the rest (one worker, the peers); None without ``--pin``."""
    if not pin:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[:2]) if "w=2" in system else {allowed[0]}


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


@dataclass(frozen=True, slots=True)
class Run:
    """One timed write: wall seconds, CPU seconds of this process (the parent, with its
    threads) and of its worker processes."""

    n: int
    wall: float
    parent_cpu: float
    worker_cpu: float

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def per_cpu(self) -> float:
        return self.n / max(self.parent_cpu + self.worker_cpu, 1e-9)


def measure(
    system: str, workload: str, n: int, tmp: str, shard_bytes: int, pin: bool = False
) -> Run:
    """One write of ``n`` samples (with ``pin``, on the cores :func:`_cores` gives)."""
    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    run = SYSTEMS[system](workload, n, out, shard_bytes)
    gc.collect()
    before = os.sched_getaffinity(0)
    cores = _cores(system, pin)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    try:
        (self0, child0), t0 = cpu_seconds(), time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        self1, child1 = cpu_seconds()
    finally:
        os.sched_setaffinity(0, before)
    del run
    shutil.rmtree(out, ignore_errors=True)
    return Run(n, wall, self1 - self0, child1 - child0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=["embed", "blobs"])
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--embed-n", type=int, default=20_480)
    parser.add_argument("--blobs-n", type=int, default=3_072)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--tmp", default=None, help="folder for the outputs (default: a temp dir)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="run 2-worker systems on 2 cores and every other system on 1 (sched_setaffinity)",
    )
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-build-scaling-", dir=args.tmp)
    shard_bytes = args.shard_mb * 2**20
    print(
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} repeats={args.repeats} pin={args.pin}"
    )
    try:
        for workload in args.workloads:
            n = args.embed_n if workload == "embed" else args.blobs_n
            got: dict[str, list[Run]] = {s: [] for s in args.systems}
            for _ in range(args.repeats):  # interleaved: load changes hit every system
                for system in args.systems:
                    got[system].append(measure(system, workload, n, tmp, shard_bytes, args.pin))
            print(f"\n{workload}: n={n}, shard {args.shard_mb} MiB, load {os.getloadavg()[0]:.1f}")
            wall = {s: statistics.median(r.rate for r in v) for s, v in got.items()}
            cpu = {s: statistics.median(r.per_cpu for r in v) for s, v in got.items()}
            for s in args.systems:
                runs = " ".join(f"{r.rate:,.0f}" for r in got[s])
                parent = statistics.median(r.parent_cpu for r in got[s])
                workers = statistics.median(r.worker_cpu for r in got[s])
                print(
                    f"  {s:<14} {wall[s]:9,.0f} samples/s  {cpu[s]:9,.0f} samples/CPU-s"
                    f"  CPU-s parent {parent:6.2f} workers {workers:6.2f}  (runs: {runs})"
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
