"""JPEG samples end to end: our loader (and LitData, when it imports) over the same images.

    python bench/experiments/jpeg_loader.py DIR [--n 2048] [--workers 0 2] [--repeat 3]
        [--systems ours litdata] [--decode-size 128]

Builds (once, under ``DIR``) the bench's ``jpeg`` workload (256x256 photo-like JPEGs, quality
90, an int ``.cls`` label and a JSON field) with our builder and with LitData's ``optimize``,
then reads each with batches of 64 at each worker count and prints samples/s and samples per
CPU second of the process and its workers (each the best of ``--repeat`` full epochs, the first
batch included), with the load average before and after the runs.
``--decode-size`` also reads ours with the JPEGs registered to decode at that size
(:class:`wdsloader.decode.images.ImageDecoder`, DCT scaling).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def cpu() -> float:
    """CPU seconds of this process and its reaped children (the loader's workers)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def epoch(loader) -> int:
    n = 0
    for batch in loader:
        n += len(batch["image"])
    return n


def main() -> None:
    from bench import systems

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--systems", nargs="+", default=["ours", "litdata"])
    p.add_argument("--decode-size", type=int, default=0)
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}")
    runs = list(args.systems)
    if args.decode_size:
        runs.append("ours-scaled")
    for system in runs:
        kind = system.split("-")[0]
        path = os.path.join(args.dir, f"{kind}-{args.n}")
        if not os.path.exists(path):
            systems.WRITE[kind]("jpeg", args.n, path, 2, 32 << 20)
        if system == "ours-scaled":
            from wdsloader.decode.images import ImageDecoder
            from wdsloader.decode.registry import register_decoder

            scaled = ImageDecoder(decode_size=(args.decode_size, args.decode_size))
            register_decoder("jpg", scaled, replace=True)
        for workers in args.workers:
            best = per_cpu = 0.0
            for _ in range(args.repeat):
                c, t = cpu(), time.perf_counter()
                reader = systems.read_ours if kind == "ours" else systems.read_litdata
                n = epoch(reader("jpeg", path, workers))
                best = max(best, n / (time.perf_counter() - t))
                per_cpu = max(per_cpu, n / (cpu() - c))
            print(
                f"| {system} | num_workers={workers} | {best:,.0f} samples/s "
                f"| {per_cpu:,.0f} samples per CPU s | n={n} |"
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
