"""Where a busy consumer's step time goes: one system's loader in this process, with the busy
consumer's work after each batch (bench/busy.py).

    OPENBLAS_NUM_THREADS=1 python bench/experiments/busy_loader.py SYSTEM WORKLOAD PATH \
        [--busy matmul|gil|none] [--workers 0] [--batches 60] [--rounds 3]

Per round (a fresh loader each time; the first ``--skip`` batches are not counted): wall
samples/s, the share of the step spent waiting in ``next``, CPU per batch of the whole process
(its threads and, with workers, the reaped workers not counted), of the main thread, and of the
other threads (process minus main thread), and the context switches per batch of this process
(voluntary: a thread blocked, e.g. on a lock or a queue; involuntary: preempted). CPU times are
robust where other jobs share the cores; compare systems within one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import busy, systems  # noqa: E402


def one_round(args: argparse.Namespace) -> dict[str, float]:
    consumer = busy.Consumer(args.busy) if args.busy != "none" else None
    systems.IMPORTS[args.system]()
    loader = systems.READ[args.system](args.workload, args.path, args.workers)
    it = iter(loader)
    for _ in range(args.skip):
        next(it)
        if consumer is not None:
            consumer()
    wait = work = 0.0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, main0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    samples = 0
    for _ in range(args.batches):
        t = time.perf_counter()
        batch = next(it, None)
        wait += time.perf_counter() - t
        if batch is None:
            break
        samples += len(batch["label"])
        if consumer is not None:
            t = time.perf_counter()
            consumer()
            work += time.perf_counter() - t
    wall = time.perf_counter() - t0
    cpu, main = time.process_time() - cpu0, time.thread_time() - main0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    del it, loader
    n = args.batches
    return {
        "samples/s": samples / wall,
        "wait %": 100 * wait / wall,
        "work ms": 1e3 * work / n,
        "cpu ms/batch": 1e3 * cpu / n,
        "main ms/batch": 1e3 * main / n,
        "other ms/batch": 1e3 * (cpu - main) / n,
        "vol cs/batch": (r1.ru_nvcsw - r0.ru_nvcsw) / n,
        "invol cs/batch": (r1.ru_nivcsw - r0.ru_nivcsw) / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("system")
    p.add_argument("workload")
    p.add_argument("path")
    p.add_argument("--busy", default="matmul", choices=(*busy.KINDS, "none"))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"{args.system} {args.workload} busy={args.busy} nw={args.workers}: load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    for _ in range(args.rounds):
        r = one_round(args)
        print("  " + ", ".join(f"{k} {v:,.1f}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
