"""Loader throughput on embedding-style samples: wdsloader vs webdataset, same shards, same work.

    python bench/loader_throughput.py [--samples 100000] [--workers 0 2] [--repeats 3]

Builds (once, cached in --data) ~9.4 KB samples (question_emb f32[384], steering f32[384],
negatives f32[4,384], a small JSON) with build_shards, then reads one shuffled epoch with batch
256 through each loader, decoding the three arrays and stacking them into tensors. Runs are
interleaved; the median of --repeats is reported, with the shuffle quality of our stream.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

BATCH = 256


def generate(n: int):
    rng = np.random.default_rng(0)
    for i in range(n):
        yield {
            "question_emb": rng.normal(size=384).astype(np.float32),
            "steering": rng.normal(size=384).astype(np.float32),
            "negatives": rng.normal(size=(4, 384)).astype(np.float32),
            "meta": {"i": i, "cluster": i % 97},
        }


def ensure_data(path: str, n: int) -> list[str]:
    from build_shards import build_shards
    from wdsloader.format import Manifest

    if not os.path.exists(os.path.join(path, "manifest.json")):
        build_shards(generate(n), path, shard_max_count=2000, workers=2)
    m = Manifest.load(path)
    return [os.path.join(path, s.path) for s in m.split("train").shards]


def run_ours(path: str, workers: int) -> tuple[float, list[int]]:
    from wdsloader import create_loader

    loader = create_loader(
        path,
        "train",
        batch_size=BATCH,
        num_workers=workers,
        drop_last=False,
        fields=["question_emb", "steering", "negatives", "meta"],
    )
    ids: list[int] = []
    t0 = time.perf_counter()
    for batch in loader:
        ids.extend(m["i"] for m in batch["meta"])
    return time.perf_counter() - t0, ids


def run_webdataset(urls: list[str], workers: int) -> tuple[float, list[int]]:
    import webdataset as wds

    def stack(samples):
        q, s, n, meta = zip(*samples, strict=True)
        return (
            torch.from_numpy(np.stack(q)),
            torch.from_numpy(np.stack(s)),
            torch.from_numpy(np.stack(n)),
            list(meta),
        )

    ds = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            nodesplitter=None,
            workersplitter=wds.split_by_worker,
            seed=0,
        )
        .shuffle(5000)
        .decode()
        .to_tuple("question_emb.npy", "steering.npy", "negatives.npy", "meta.json")
        .batched(BATCH, collation_fn=stack, partial=True)
    )
    loader = wds.WebLoader(ds, batch_size=None, num_workers=workers)
    ids: list[int] = []
    t0 = time.perf_counter()
    for batch in loader:
        ids.extend(m["i"] for m in batch[3])
    return time.perf_counter() - t0, ids


def quality(ids: list[int]) -> dict[str, float]:
    from scipy.stats import spearmanr

    arr = np.asarray(ids)
    n = len(arr)
    rho = float(spearmanr(arr, np.arange(n)).statistic)
    return {
        "abs_rho": abs(rho),
        "consecutive_distance_over_n": float(np.abs(np.diff(arr)).mean() / n),
        "exactly_once": bool(n == len(set(ids))),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default="/tmp/wdsloader_bench_embed")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    path = f"{args.data}_{args.samples}"
    urls = ensure_data(path, args.samples)
    results = []
    for workers in args.workers:
        times: dict[str, list[float]] = {"wdsloader": [], "webdataset": []}
        qual = {}
        for _ in range(args.repeats):
            for name, fn, target in (
                ("wdsloader", run_ours, path),
                ("webdataset", run_webdataset, urls),
            ):
                dt, ids = fn(target, workers)
                times[name].append(dt)
                qual[name] = quality(ids)
        for name, ts in times.items():
            med = statistics.median(ts)
            row = {
                "loader": name,
                "num_workers": workers,
                "samples": args.samples,
                "median_s": round(med, 3),
                "samples_per_s": round(args.samples / med),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in qual[name].items()},
            }
            results.append(row)
            print(json.dumps(row))
        ratio = statistics.median(times["webdataset"]) / statistics.median(times["wdsloader"])
        print(f"num_workers={workers}: wdsloader / webdataset samples/s = {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
