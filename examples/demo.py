"""`make demo`: build shards from a generated dataset, stream them back, resume mid-epoch.

python examples/demo.py [--out demo_out] [--samples 3000] [--workers 2]
"""

from __future__ import annotations

import argparse
import shutil
import time

import numpy as np
import torch

from build_shards import ShardOptions, build_shards
from wdsloader import create_loader


def generate(n: int, dim: int = 64):
    """Embedding-style samples: a question vector, hard negatives, a label, a text."""
    rng = np.random.default_rng(0)
    for i in range(n):
        yield {
            "question_emb": rng.normal(size=dim).astype(np.float32),
            "negatives": rng.normal(size=(4, dim)).astype(np.float32),
            "cluster_id": int(i % 10),
            "relevance": float(rng.uniform()),
            "text": f"question number {i}",
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="demo_out")
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    out = f"{args.out}/dataset"
    shutil.rmtree(args.out, ignore_errors=True)

    t0 = time.perf_counter()
    manifest = build_shards(
        generate(args.samples),
        out,
        splits={"train": 0.8, "val": 0.1, "test": 0.1},
        shards=ShardOptions(max_count=500),
        workers=args.workers,
        seed=0,
    )
    build_s = time.perf_counter() - t0
    print(f"built {manifest.num_samples} samples in {build_s:.2f}s -> {out}")
    for name, split in manifest.splits.items():
        print(
            f"  {name:5s} {len(split.shards):2d} shards {split.num_samples:5d} samples "
            f"{split.num_bytes / 1e6:6.2f} MB"
        )
    print(
        "  schema: "
        + ", ".join(
            f"{k}:{v.encoding}{'' if v.shape is None else list(v.shape)}"
            for k, v in manifest.schema.items()
        )
    )

    loader = create_loader(out, "train", batch_size=64, num_workers=args.workers)
    t0 = time.perf_counter()
    seen = []
    for batch in loader:
        seen.extend(batch["__key__"])
    read_s = time.perf_counter() - t0
    first = next(iter(create_loader(out, "train", batch_size=64)))
    print(
        f"read epoch 0 of train: {len(loader)} batches, {len(seen)} samples "
        f"({len(set(seen))} distinct) in {read_s:.2f}s with {args.workers} workers"
    )
    print(
        "  first batch: "
        + ", ".join(
            f"{k}{list(v.shape)}" if isinstance(v, torch.Tensor) else f"{k}[{len(v)}]"
            for k, v in first.items()
        )
    )

    # exact mid-epoch resume: stop after 5 batches, save, continue in a new loader
    a = create_loader(out, "train", batch_size=64)
    head = []
    for i, batch in enumerate(a):
        head.append(batch["__key__"])
        if i == 4:
            break
    resumed = create_loader(out, "train", batch_size=64)
    resumed.load_state_dict(a.state_dict())
    tail = [b["__key__"] for b in resumed]
    full = [b["__key__"] for b in create_loader(out, "train", batch_size=64)]
    print(
        f"resume after 5 batches: {len(tail)} more batches, identical to an uninterrupted "
        f"epoch: {head + tail == full}"
    )


if __name__ == "__main__":
    main()
