"""Thread workers against process workers: throughput, CPU, peak memory and start-up.

    python bench/experiments/worker_modes.py [--workloads embed,embed_running,jpeg,blobs]
        [--workers 2] [--repeats 2] [--data DIR] [--scale 1.0]

Builds each bench workload once (``bench.systems.write_ours``, the bench's shards; ``--scale``
times its ``--quick`` size) and reads one epoch of it with ``create_loader(...,
num_workers=W, workers=WorkerOptions(mode=...))`` for each mode, each run in a fresh process,
the modes alternating. Prints per run: samples/s (wall), samples per CPU second (the process
and its workers: fair on a loaded machine), time to the first batch (from ``create_loader``),
peak RSS of the whole process tree (sampled every 20 ms from /proc: the loader's process plus
its worker processes; RSS summed, and PSS, which counts a page shared by n processes 1/n
in each) and the load average while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MODES = ("process", "thread")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """RSS and PSS (shared pages divided among their users) of ``pid`` and its descendants,
    summed, in MB."""
    rss = pss = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith(("Rss:", "Pss:")):
                        kb = int(line.split()[1])
                        rss, pss = (rss + kb, pss) if line[0] == "R" else (rss, pss + kb)
        except (OSError, ValueError):
            continue
    return rss / 1024, pss / 1024


class PeakTree(threading.Thread):
    """Samples the process tree's RSS until stopped; ``peak`` is the largest seen."""

    def __init__(self, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.every, self.peak, self.peak_pss = every, 0.0, 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            rss, pss = tree_memory_mb(os.getpid())
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)


def cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch in this (fresh) process."""
    import torch  # noqa: F401 - imported before the clock, as by a training script

    from bench.systems import BATCH, finish
    from wdsloader import create_loader
    from wdsloader.stream.options import WorkerOptions

    load0 = os.getloadavg()[0]
    monitor = PeakTree()
    monitor.start()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    loader = create_loader(
        spec["path"], "train", batch_size=BATCH, num_workers=spec["workers"], seed=0,
        workers=WorkerOptions(mode=spec["mode"]),
    )  # fmt: skip
    samples, first = 0, None
    for batch in loader:
        batch = finish(spec["workload"], batch)
        if first is None:
            first = time.perf_counter() - t0
        samples += len(batch["__key__"])
    seconds = time.perf_counter() - t0
    del loader, batch
    cpu = cpu_seconds() - cpu0  # worker processes are reaped at the end of the epoch
    monitor.done.set()
    monitor.join()
    return {
        "samples": samples,
        "samples_per_s": samples / seconds,
        "samples_per_cpu_s": samples / cpu,
        "ttfb_s": first,
        "peak_tree_rss_mb": monitor.peak,
        "peak_tree_pss_mb": monitor.peak_pss,
        "load": (load0 + os.getloadavg()[0]) / 2,
    }


def build(workload: str, data: str, scale: float) -> str:
    from bench.systems import write_ours
    from bench.workloads import WORKLOADS

    n = int(WORKLOADS[workload].n(True) * scale)
    path = os.path.join(data, f"{workload}-{n}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        write_ours(workload, n, path, workers=1, shard_bytes=4 * 2**20)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="embed,embed_running,jpeg,blobs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wdsloader-modes"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    print(f"num_workers={args.workers}, {os.cpu_count()} CPUs; each row: median of {args.repeats}")
    print(
        "| workload | mode | samples/s | samples/CPU-s | first batch s | peak tree RSS MB "
        "| peak tree PSS MB | load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        path = build(workload, args.data, args.scale)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                spec = {"path": path, "workload": workload, "mode": mode, "workers": args.workers}
                out = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for mode in MODES:
            rows = runs[mode]

            def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                values = sorted(r[key] for r in rows)
                return values[len(values) // 2]

            print(
                f"| {workload} | {mode} | {med('samples_per_s'):,.0f} | "
                f"{med('samples_per_cpu_s'):,.0f} | {med('ttfb_s'):.2f} | "
                f"{med('peak_tree_rss_mb'):,.0f} | {med('peak_tree_pss_mb'):,.0f} | "
                f"{med('load'):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
