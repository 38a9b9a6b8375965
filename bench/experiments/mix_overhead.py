"""Three datasets mixed (by MultiDataLoader, and sample by sample) vs one loader over the same
bytes: samples/s and ratios.

python bench/experiments/mix_overhead.py [--samples 60000] [--batch-size 256] [--workers 0] [--repeats 3]
    [--persistent]

The single dataset holds the three corpora's samples together; the mix reads the three datasets
through ``MultiDataLoader`` (WEIGHTED in proportion to their sizes, so each sample once per epoch)
and through one ``create_loader`` over a list of ``MixSource`` (each once per epoch, every batch
mixing the three: the sample-level mix).
Both read the same bytes from the page cache; runs alternate, and the best of ``--repeats``
epochs of each is reported.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from build_shards import build_shards
from wdsloader import MultiDataLoader, MultiDataLoaderConfig, create_loader
from wdsloader.mix import MixSource

SHARES = {"a": 0.6, "b": 0.3, "c": 0.1}


def samples(n: int, offset: int):
    rng = np.random.default_rng(offset)
    for i in range(n):
        yield {
            "x": rng.normal(size=64).astype(np.float32),
            "label": int(i % 10),
            "meta": {"i": offset + i},
            "text": f"document {offset + i}",
        }


def epoch_rate(loader) -> float:
    n, t0 = 0, time.perf_counter()
    for batch in loader:
        b = batch.batch if hasattr(batch, "batch") else batch
        n += len(b["__key__"])
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = {k: int(args.samples * v) for k, v in SHARES.items()}

        def everything():
            offset = 0
            for n in sizes.values():
                yield from samples(n, offset)
                offset += n

        build_shards(everything(), str(root / "single"), shard_max_count=5000)
        offset = 0
        for name, n in sizes.items():
            build_shards(samples(n, offset), str(root / name), shard_max_count=5000)
            offset += n
        kw = {"num_workers": args.workers, "seed": 0, "drop_last": False}
        if args.persistent:
            kw["persistent_workers"] = True
        single = create_loader(str(root / "single"), "train", args.batch_size, **kw)
        loaders = [create_loader(str(root / k), "train", args.batch_size, **kw) for k in sizes]
        lengths = [len(x) for x in loaders]
        mix = MultiDataLoader(
            loaders,
            MultiDataLoaderConfig(sampling_strategy="weighted", dataloader_weights=lengths),
        )
        sources = [MixSource(root / k) for k in sizes]  # each once per epoch
        mixed = create_loader(sources, "train", args.batch_size, **kw)
        runs = {"single": single, "mix": mix, "sources": mixed}
        for loader in runs.values():  # warm the page cache and the code paths
            epoch_rate(loader)
        best = dict.fromkeys(runs, 0.0)
        for _ in range(args.repeats):
            for name, loader in runs.items():
                best[name] = max(best[name], epoch_rate(loader))
    print(
        f"samples {sum(sizes.values())} batch {args.batch_size} workers {args.workers}"
        f"{' persistent' if args.persistent else ''}"
    )
    print(f"single loader      {best['single']:>10.0f} samples/s")
    print(f"MultiDataLoader x3 {best['mix']:>10.0f} samples/s")
    print(f"Source mix x3      {best['sources']:>10.0f} samples/s")
    print(f"ratio mix/single   {best['mix'] / best['single']:>10.3f}")
    print(f"ratio Source/single{best['sources'] / best['single']:>10.3f}")


if __name__ == "__main__":
    main()
