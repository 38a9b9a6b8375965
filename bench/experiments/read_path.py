"""In-process read speed of two checkouts of wdsloader over the same shards, alternating.

    python bench/experiments/read_path.py OLD_TREE NEW_TREE [--rounds 5] [--n 20000] [--dim 256]

Builds (once, under ``--data``) a dataset of ``--n`` samples with a float32 embedding of
``--dim``, an int label and a small JSON object, then runs one timing subprocess per tree and
configuration, alternating the trees, ``--rounds`` times. Each subprocess puts its tree first on
``sys.path``, builds the loader (``num_workers=0``, batch size 256) and times full passes over
the split (best of ``--passes``): the CPU time of the process (all its threads) per sample, and
the wall time as samples/s. Prints the medians over rounds per tree and their new/old ratios,
per configuration: ``gather`` (the columnar path), ``rows`` (``gather=False``) and
``curriculum`` (a stored variant and a zero variant, gathered). On a shared machine the wall
time mostly measures the other processes; the CPU time is the steadier measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGS = {
    "gather": {},
    "rows": {"gather": False},
    "curriculum": {"curriculum": {"variants": {"emb": "emb2", "zero": None}, "output": "steer"}},
}

_TIMER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from wdsloader import create_loader
root, opts, passes = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
if "curriculum" in opts:
    from wdsloader.curriculum import Curriculum, fixed
    c = opts.pop("curriculum")
    opts["curriculum"] = Curriculum(c["variants"], output=c["output"], index_output=None,
                                    schedule=fixed([0.5, 0.5]))
    opts["fields"] = ["label", "meta", "steer"]
loader = create_loader(root, "train", batch_size=256, seed=0, num_workers=0, **opts)
wall, cpu, n = float("inf"), float("inf"), 0
for _ in range(passes):
    t, c = time.perf_counter(), time.process_time()
    n = sum(len(b["label"]) for b in loader)
    wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
print(json.dumps({"samples": n, "wall": wall, "cpu": cpu}))
"""


def build(root: Path, n: int, dim: int) -> None:
    import numpy as np

    from build_shards import build_shards

    rng = np.random.default_rng(0)
    pool = rng.normal(size=(1021, dim)).astype(np.float32)
    rows = (
        {
            "__key__": f"s{i:08d}",
            "emb": pool[i % 1021],
            "emb2": pool[(i * 7) % 1021],
            "label": i % 1000,
            "meta": {"i": i, "source": "bench", "tags": ["a", "b"][: i % 3]},
        }
        for i in range(n)
    )
    build_shards(rows, str(root), shard_max_count=5000, splits={"train": 1.0})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--data", default="/tmp/wdsloader-read-path")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    root = Path(args.data) / f"n{args.n}-d{args.dim}"
    if not (root / "manifest.json").exists():
        build(root, args.n, args.dim)
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.environ.get("READ_PATH_EXTRA", "")
    for config in args.configs.split(","):
        cpu: dict[str, list[float]] = {"old": [], "new": []}
        rate: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                out = subprocess.run(
                    [sys.executable, "-c", _TIMER, trees[name], str(root),
                     json.dumps(CONFIGS[config]), str(args.passes)],
                    check=True, capture_output=True, text=True, env=env,
                )  # fmt: skip
                result = json.loads(out.stdout.strip().splitlines()[-1])
                cpu[name].append(result["cpu"] / result["samples"] * 1e6)
                rate[name].append(result["samples"] / result["wall"])
        c_old, c_new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
        w_old, w_new = statistics.median(rate["old"]), statistics.median(rate["new"])
        print(
            f"{config:11s} CPU us/sample old {c_old:6.2f} new {c_new:6.2f} new/old "
            f"{c_new / c_old:.3f} | wall samples/s old {w_old:7.0f} new {w_new:7.0f} new/old "
            f"{w_new / w_old:.3f} | rounds cpu old {[round(x, 2) for x in cpu['old']]} "
            f"new {[round(x, 2) for x in cpu['new']]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
