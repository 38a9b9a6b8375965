"""Shuffle quality of the loader's default plan: 100,000 samples in 50 shards, several seeds.

    python bench/experiments/shuffle_quality.py [--seeds 20]

Prints, for the span and window create_loader derives for small and for embedding-sized samples,
the Spearman |rho| between source order and stream order and the mean distance in source order
between consecutive stream samples divided by N (a uniform permutation gives 0.333).
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import spearmanr

from wdsloader import plan
from wdsloader.stream.loader import default_span_window


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    n, batch = 100_000, 256
    for label, avg in (("small samples (2.5 KB)", 2500), ("embedding samples (9.6 KB)", 9600)):
        span, window = default_span_window(n, n * avg, batch)
        rhos, dists = [], []
        for seed in range(args.seeds):
            cfg = plan.PlanConfig(
                counts=(n // 50,) * 50, batch_size=batch, seed=seed, span=span, window=window
            )
            stream = np.concatenate(plan.rank_batches(cfg, 0, 0))
            rhos.append(abs(spearmanr(stream, np.arange(len(stream))).statistic))
            dists.append(np.abs(np.diff(stream)).mean() / n)
        print(
            f"{label}: span {span}, window {window}: |rho| mean {np.mean(rhos):.4f} "
            f"max {np.max(rhos):.4f}; consecutive distance / N mean {np.mean(dists):.3f} "
            f"min {np.min(dists):.3f}"
        )


if __name__ == "__main__":
    main()
