"""Lists and generators on Ray: the throughput of a list whose ``map`` costs ``--map-ms`` per item
on a local Ray of 1 and of 2 CPUs (same machine, a fresh Ray each), and the driver's peak memory
(max RSS) while it feeds a generator of ``--gen-items`` small items to a Ray build. Run:

    python bench/experiments/ray_sources.py [--items 200] [--map-ms 50] [--gen-items 1000000]

Each measurement runs in a process of its own (peak RSS is per process); the builds' wall time
excludes ``ray.init`` and a first, warm-up build.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time


def slow_map(item: dict) -> dict:
    time.sleep(item["ms"] / 1000)  # stands for a download, resize or tokenisation
    return {"i": item["i"], "text": "x" * 100}


def list_build(cpus: int, items: int, ms: float, out: str) -> dict:
    import ray

    from build_shards import ShardOptions, build_shards

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:  # a first build starts and warms Ray's worker processes (imports): not measured
        warm = [{"i": i, "ms": 0.0} for i in range(10 * cpus)]
        build_shards(warm, f"{out}-warm", engine="ray", map=slow_map,
                     shards=ShardOptions(block_size=10))  # fmt: skip
        t0 = time.perf_counter()
        m = build_shards(
            [{"i": i, "ms": ms} for i in range(items)], out, engine="ray", map=slow_map,
            shards=ShardOptions(block_size=10),
        )  # fmt: skip
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return {"cpus": cpus, "items": m.num_samples, "wall_s": round(wall, 2),
            "items_per_s": round(items / wall, 1)}  # fmt: skip


def generator_build(n: int, out: str) -> dict:
    import ray

    from build_shards import build_shards

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        m = build_shards(({"i": i} for i in range(n)), out, engine="ray")
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"items": m.num_samples, "blocks": m.build["num_blocks"], "wall_s": round(wall, 1),
            "driver_peak_rss_mb_before": before // 1024, "driver_peak_rss_mb": peak // 1024}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--map-ms", type=float, default=50.0)
    ap.add_argument("--gen-items", type=int, default=1_000_000)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        spec = json.loads(args.one)
        with tempfile.TemporaryDirectory() as tmp:
            if spec["what"] == "list":
                res = list_build(spec["cpus"], args.items, args.map_ms, f"{tmp}/ds")
            else:
                res = generator_build(args.gen_items, f"{tmp}/ds")
        print(json.dumps(res))
        return
    specs = [{"what": "list", "cpus": 1}, {"what": "list", "cpus": 2}]
    for spec in [*specs, {"what": "gen"}] if args.gen_items else specs:
        cmd = [sys.executable, __file__, "--one", json.dumps(spec), "--items", str(args.items),
               "--map-ms", str(args.map_ms), "--gen-items", str(args.gen_items)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(spec, out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
