"""profile_dataloader on our shard loader and on the factory's plain loader, for the same data.

    .venv/bin/python bench/experiments/profile_training.py [--samples 20000] [--dim 256] [--batch 256]
        [--workers 0,2] [--batches 60] [--step-ms 5] [--repeats 3] [--out DIR]

Writes ``--samples`` samples ``{"x": float32[dim], "y": int}`` as shards (``build_shards``),
then, for each worker count, profiles (1) ``create_loader`` over the shards and (2)
``DataLoaderFactory().create_dataloader`` over the same samples held in memory as a list of
dicts (torch's default collate): reading alone, with a simulated training step of ``--step-ms``
(a sleep: the wait share shows how much of the step time loading costs), and the replay upper
bound (the step over cached batches). Both loaders shuffle with seed 0 and keep the last partial
batch. Every measurement is repeated ``--repeats`` times, round robin over the rows, with a
fresh loader each time; the table shows medians. The machine is shared: compare rows within one
run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.training import DataLoaderConfig, DataLoaderFactory, profile_dataloader


def samples(n: int, dim: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return [{"x": x[i], "y": int(i % 10)} for i in range(n)]


def loaders(root: str, data: list[dict[str, Any]], batch: int, workers: int) -> dict[str, Any]:
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    ours = create_loader(
        root, "train", batch, num_workers=workers, seed=0, shuffle=True, drop_last=False, **extra
    )
    config = DataLoaderConfig(batch_size=batch, num_workers=workers, seed=0, shuffle=True)
    plain_data = [{"x": torch.from_numpy(s["x"]), "y": s["y"]} for s in data]
    plain = DataLoaderFactory().create_dataloader(plain_data, config)
    return {"wdsloader": ours, "factory (in memory)": plain}


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="keep the shards here (default: a temp dir)")
    args = parser.parse_args()
    data = samples(args.samples, args.dim)
    tmp = tempfile.TemporaryDirectory() if args.out is None else None
    root = os.path.join(args.out or (tmp.name if tmp else "."), "ds")
    if not os.path.exists(os.path.join(root, "manifest.json")):
        t = time.perf_counter()
        build_shards(data, root, seed=0)
        print(f"built {args.samples} samples in {time.perf_counter() - t:.1f} s: {root}")

    def step(batch: Any) -> None:  # a simulated training step
        time.sleep(args.step_ms / 1e3)

    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for workers in (int(w) for w in args.workers.split(",")):
            for name, loader in loaders(root, data, args.batch, workers).items():
                for mode in ("read", "step", "replay"):
                    r = profile_dataloader(
                        loader,
                        num_batches=args.batches,
                        step_fn=None if mode == "read" else step,
                        replay=mode == "replay",
                    )
                    runs.setdefault((name, workers, mode), []).append(r.to_dict())
    print(
        f"batch {args.batch}, {args.batches} batches per run, step {args.step_ms} ms (sleep), "
        f"median of {args.repeats}"
    )
    print(
        f"{'loader':22s} {'W':>2s} {'mode':8s} {'samples/s':>10s} {'batches/s':>9s} "
        f"{'first s':>8s} {'wait p50 ms':>11s} {'p95 ms':>7s} {'wait share':>10s}"
    )
    rows = []
    for (name, workers, mode), results in runs.items():
        med = {k: _median([r[k] for r in results]) for k in results[0] if k != "replay"}
        rows.append({"loader": name, "workers": workers, "mode": mode, **med, "runs": results})
        share = "-" if med["wait_share"] is None else f"{med['wait_share']:.1%}"
        print(
            f"{name:22s} {workers:2d} {mode:8s} {med['samples_per_s']:10,.0f} "
            f"{med['batches_per_s']:9.1f} {med['time_to_first_batch_s'] or 0:8.3f} "
            f"{(med['wait_p50_s'] or 0) * 1e3:11.3f} {(med['wait_p95_s'] or 0) * 1e3:7.3f} "
            f"{share:>10s}"
        )
    if args.out:
        with open(os.path.join(args.out, "profile_training.json"), "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
