"""Loader throughput with planned packing against unpacked batches, in tokens per second.

    python bench/experiments/packing_throughput.py [--docs 20000] [--mu 5.5] [--sigma 1]
        [--max-tokens 2048] [--rows 8] [--workers 0] [--epochs 2] [--out DIR]

Builds (once, under ``--out``) ``--docs`` documents of ``ceil(lognormal(mu, sigma))`` int32
tokens with their lengths recorded, then reads full epochs with ``create_loader``:

- packed: ``packing=Packing(max_tokens=...)``, batches of ``--rows`` rows of ``max_tokens``;
- unpacked: batches of as many documents as a packed batch holds on average, each padded to
  its longest document (a module-level collate function; documents over ``max_tokens`` cut).

Prints, per mode, the epoch time (the first epoch includes planning the packs), real (non-pad)
tokens/s, the slots (tokens incl. padding) per real token, and the pad share.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def pad_to_longest(samples: list[dict[str, Any]], max_tokens: int = 2048) -> dict[str, Any]:
    """Documents as one ``[n, longest]`` int64 batch padded with 0 (cut to ``max_tokens``)."""
    rows = [np.asarray(s["input_ids"])[:max_tokens] for s in samples]
    out = np.zeros((len(rows), max(len(r) for r in rows)), np.int64)
    mask = np.zeros(out.shape, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)], mask[i, : len(r)] = r, 1
    return {"input_ids": torch.from_numpy(out), "attention_mask": torch.from_numpy(mask)}


class PadToLongest:
    """:func:`pad_to_longest` with a ``max_tokens`` (picklable for workers)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return pad_to_longest(samples, self.max_tokens)


def build(out: Path, docs: int, mu: float, sigma: float) -> None:
    from build_shards import SampleOptions, ShardOptions, build_shards

    if (out / "manifest.json").exists():
        return
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, np.ceil(rng.lognormal(mu, sigma, docs))).astype(np.int64)
    samples = (
        {"__key__": f"d{i:07d}", "input_ids": rng.integers(1, 50_000, n, dtype=np.int32)}
        for i, n in enumerate(lengths)
    )
    build_shards(
        samples, out, splits={"train": 1.0}, shards=ShardOptions(max_count=2000),
        samples=SampleOptions(lengths="input_ids"),
    )  # fmt: skip


def measure(loader: Any, epochs: int) -> list[tuple[float, int, int]]:
    """Per epoch: seconds, real tokens, slots."""
    out = []
    for _ in range(epochs):
        t0, real, slots = time.perf_counter(), 0, 0
        for batch in loader:
            mask = batch["attention_mask"]
            real += int(mask.sum())
            slots += mask.numel()
        out.append((time.perf_counter() - t0, real, slots))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--mu", type=float, default=5.5)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from wdsloader import Packing, create_loader

    out = Path(args.out or tempfile.mkdtemp(prefix="packing_tp_")) / "ds"
    t0 = time.perf_counter()
    build(out, args.docs, args.mu, args.sigma)
    print(f"dataset: {args.docs} docs, built in {time.perf_counter() - t0:.1f} s ({out})")
    common = dict(num_workers=args.workers, seed=0, drop_last=True, pin_memory=False)
    t0 = time.perf_counter()
    packed = create_loader(
        str(out), "train", args.rows, packing=Packing(max_tokens=args.max_tokens), **common
    )
    made = time.perf_counter() - t0
    docs_per_batch = max(1, round(args.docs / max(1, len(packed) * 1.0)))
    unpacked = create_loader(
        str(out), "train", docs_per_batch, collate_fn=PadToLongest(args.max_tokens), **common
    )
    print(
        f"packed loader made in {made:.2f} s (lengths read); {docs_per_batch} docs a batch unpacked"
    )
    for name, loader in (("packed", packed), ("unpacked", unpacked)):
        for epoch, (secs, real, slots) in enumerate(measure(loader, args.epochs)):
            print(
                f"{name:9s} epoch {epoch}: {secs:6.2f} s, {real / secs / 1e6:6.2f} M real tokens/s, "
                f"{slots / real:.3f} slots per real token, pad share {1 - real / slots:.1%}"
            )


if __name__ == "__main__":
    main()
