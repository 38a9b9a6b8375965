"""Packing efficiency of the planned packing (best-fit decreasing within a window of documents)
against naive greedy concatenation, on log-normal document lengths.

    python bench/experiments/packing_efficiency.py [--docs 100000] [--mu 6] [--sigma 1]
        [--max-tokens 4096] [--windows 1 100 500 1000 2000 4000] [--seeds 3]

Prints, per window, the efficiency (non-pad tokens / all tokens) averaged over the seeds, its
minimum, the rows and the planning time; the greedy baseline first. Lengths are
``ceil(lognormal(mu, sigma))`` (at least 1); documents over ``max_tokens`` are split.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from wdsloader.plan.packing import greedy_packs, packing_efficiency, plan_packs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--mu", type=float, default=6.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--windows", type=int, nargs="+", default=[1, 100, 500, 1000, 2000, 4000])
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    samples = [
        np.maximum(
            1, np.ceil(np.random.default_rng(s).lognormal(args.mu, args.sigma, args.docs))
        ).astype(np.int64)
        for s in range(args.seeds)
    ]
    over = np.mean([float((x > args.max_tokens).mean()) for x in samples])
    print(
        f"{args.docs} docs, lognormal(mu={args.mu}, sigma={args.sigma}), mean length "
        f"{np.mean([x.mean() for x in samples]):.0f}, {over:.2%} over max_tokens="
        f"{args.max_tokens} (split), {args.seeds} seeds"
    )
    runs = [("greedy", None)] + [(f"bfd window {w}", w) for w in args.windows]
    for label, w in runs:
        effs, rows, secs = [], [], []
        for x in samples:
            t = time.perf_counter()
            if w is None:
                packs = greedy_packs(x, args.max_tokens)
            else:
                packs = plan_packs(x, args.max_tokens, window=w)
            secs.append(time.perf_counter() - t)
            effs.append(packing_efficiency(packs, args.max_tokens))
            rows.append(len(packs))
        print(
            f"{label:>18}: efficiency {np.mean(effs):.4f} (min {np.min(effs):.4f}), "
            f"rows {np.mean(rows):.0f}, plan {np.mean(secs):.3f} s"
        )


if __name__ == "__main__":
    main()
