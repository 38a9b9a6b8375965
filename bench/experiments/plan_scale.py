"""What planning an epoch costs one rank, from 10^7 to 10^10 samples, without reading data.

    PYTHONPATH=. .venv/bin/python bench/experiments/plan_scale.py [--sizes 1e7 1e9 1e10] [--shards 200000]
        [--world 1024] [--workers 8] [--batch 256] [--span N] [--old /tmp/base --old-sizes 1e7 1e8]

The split is ``--shards`` shards of uneven size (uniform between 0.5x and 1.5x the mean, seeded)
summing to each size; span (unless ``--span``) and window are what create_loader derives for
2.5 KB samples read locally. Each figure is measured in a fresh process (``--one``) on a middle rank:

- ``first batch``: from the per-shard counts to the first batch's sample ids of DataLoader worker 0
  (PlanConfig, epoch order, geometry, one window): what each worker process pays before reading.
- ``read``: the same first batch as the loader's read-ahead hands it to the reader (which
  computes one group of batches ahead; the read itself stubbed out), for ``--workers 1`` and
  ``--world 1``: one worker's whole epoch is the split.
- ``rank epoch``: every batch of all the rank's workers, computed a slice of 64 batches at a time.
- ``elastic``: the first batch after resuming a state saved mid-epoch by ``--world`` ranks on 3/4
  of them (the consumed samples are taken out of the order: the elastic re-plan).
- peak memory: tracemalloc's peak (numpy reports its buffers to it) and the process's peak RSS
  growth over the counts.

With ``--old DIR`` (an unpacked older wdsloader, e.g. ``git archive main | tar -x -C DIR``) the
first batch is also timed with that version's plan at ``--old-sizes``, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np

SAMPLE_BYTES = 2500


def shard_counts(total: int, shards: int, seed: int = 0) -> list[int]:
    """``shards`` uneven counts summing to ``total``."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 1.5, shards)
    counts = np.floor(weights / weights.sum() * total).astype(np.int64)
    counts[: total - int(counts.sum())] += 1
    return [int(c) for c in counts]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _first_read(batches: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The first group of ``batches`` the loader's read-ahead hands its reader (a local
    store's: the first batch alone), the read itself stubbed out."""
    from wdsloader.stream.reader import BatchReader

    class Store:
        reads_locally = True

        def close(self) -> None:
            pass

    reader = BatchReader.__new__(BatchReader)  # no shards: only the read-ahead runs
    reader.store, reader.pool = Store(), None  # type: ignore[assignment]
    reader.read = lambda group, pool=None, place=False: list(group)  # type: ignore[method-assign]
    ahead = reader.read_ahead(batches, 4)
    try:
        group = ahead.next_group()
    finally:
        ahead.close()
    assert group is not None
    return group  # type: ignore[return-value]


def measure(what: str, total: int, args: argparse.Namespace) -> dict[str, float]:
    """One figure in this process (fresh: the caller runs each in its own process)."""
    from wdsloader import plan
    from wdsloader.stream.config import default_span_window

    counts = shard_counts(total, args.shards)
    span, window = default_span_window(total, total * SAMPLE_BYTES, args.batch)
    span = args.span or span
    rank = args.world // 2
    rss0 = _rss_mb()
    tracemalloc.start()
    t0 = time.perf_counter()
    cfg = plan.PlanConfig(
        counts=counts,
        batch_size=args.batch,
        world_size=args.world,
        num_workers=args.workers,
        seed=0,
        span=span,
        window=window,
    )
    ids = 0
    if what == "first":
        ids = len(plan.worker_batches(cfg, 0, rank, 0)[0])
    elif what == "read":
        ids = len(_first_read(plan.worker_batches(cfg, 0, rank, 0))[0])
    elif what == "epoch":
        for w in range(args.workers):
            batches = plan.worker_batches(cfg, 0, rank, w)
            for i in range(0, len(batches), 64):
                ids += sum(len(b) for b in batches[i : i + 64])
    elif what == "elastic":
        state = plan.Resume(cfg, plan.num_batches(cfg) // 2 + 1)
        new = plan.PlanConfig(
            counts=counts,
            batch_size=args.batch,
            world_size=args.world * 3 // 4,
            num_workers=args.workers,
            seed=0,
            span=span,
            window=window,
        )
        ids = len(plan.worker_batches(new, 0, rank, 0, state)[0])
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    return {
        "seconds": seconds,
        "tracemalloc_mb": peak / 2**20,
        "rss_growth_mb": _rss_mb() - rss0,
        "ids": ids,
        "span": span,
        "window": window,
    }


def run_one(what: str, total: int, args: argparse.Namespace, pythonpath: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--one", what, str(total)]
    cmd += ["--shards", str(args.shards), "--world", str(args.world)]
    cmd += ["--workers", str(args.workers), "--batch", str(args.batch), "--span", str(args.span)]
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[1e7, 1e9, 1e10])
    p.add_argument("--shards", type=int, default=200_000)
    p.add_argument("--world", type=int, default=1024)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--span", type=int, default=0, help="samples per span (0: create_loader's)")
    p.add_argument("--what", nargs="+", default=["first", "epoch", "elastic"])
    p.add_argument("--old", help="an older wdsloader's source folder, timed on the first batch")
    p.add_argument("--old-sizes", type=float, nargs="+", default=[1e7, 1e8])
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args)))
        return
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(
        f"{args.shards} uneven shards, {args.world} ranks x {args.workers} workers, "
        f"batch {args.batch}, rank {args.world // 2}"
    )
    rows = [("new", here, int(n), w) for n in args.sizes for w in args.what]
    if args.old:
        rows += [
            (v, d, int(n), "first")
            for n in args.old_sizes
            for v, d in (("new", here), ("old", args.old))
        ]
    for version, path, total, what in rows:
        r = run_one(what, total, args, path)
        print(
            f"{version:3} {what:7} N={total:.0e} span {r['span']} window {r['window']}: "
            f"{r['seconds']:.3f} s, tracemalloc peak {r['tracemalloc_mb']:.1f} MB, "
            f"peak RSS growth {r['rss_growth_mb']:.1f} MB ({r['ids']} ids)",
            flush=True,
        )


if __name__ == "__main__":
    main()
