"""The remote benchmark: every system streams one cold epoch from an S3 server on 127.0.0.1
behind our latency/bandwidth proxy.

    python bench/remote/run.py                       # 40 ms and 2 ms, num_workers 0 and 2
    python bench/remote/run.py --n 140000            # an epoch >= 20x our 64 MiB shuffle window
    python bench/run.py --remote [options]           # the same
    make bench-remote                                # through .venv-bench (peers installed)
    python bench/run.py --remote --render bench/results/remote.json --update docs/speed.md
        # measure nothing: rewrite remote.md/.png and the table between the file's
        # <!-- remote-bench:start --> and <!-- remote-bench:end --> markers

Builds the realistic embedding workload once per format (kept in --data), uploads each format
to the server (s3rver when installed, see bench/remote/server.py; moto otherwise), then per
profile (RTT, per-connection cap) measures the path's ceiling (parallel 16 MiB ranged GETs of
our shards through the proxy) and, per system and num_workers, one cold epoch in a fresh process
with an empty cache. The proxy counts every request by kind and the bytes it carried.

Results: OUT/remote.json, OUT/remote.md, OUT/remote.png; per-run JSON and logs in OUT/raw-remote/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import run as local  # noqa: E402
from bench.remote import readers, report  # noqa: E402
from bench.remote.machine import CpuWatch  # noqa: E402
from bench.remote.proxy import PROFILES, LatencyProxy  # noqa: E402
from bench.remote.server import S3Server, ceiling, warm_up  # noqa: E402

WORKER = os.path.join(ROOT, "bench", "remote", "worker.py")
SYSTEMS = ("ours", "ours_cache", "ours_obstore", "litdata", "mosaic", "webdataset", "hf")
WORKLOAD = "embed"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--n",
        type=int,
        default=20_480,
        help="samples, a multiple of 256 (default 20,480: 190 MB of payload, ~4 of our 64 MiB "
        "shuffle windows; 98,304 makes the epoch 20 windows)",
    )
    p.add_argument("--shard-mib", type=int, default=64, help="shard/chunk size (default 64)")
    p.add_argument("--profiles", default="40ms,2ms", help=f"of {', '.join(PROFILES)}")
    p.add_argument("--workers", default="0,2", help="num_workers values (default 0,2)")
    p.add_argument("--only", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    p.add_argument("--server", default="auto", choices=("auto", "s3rver", "moto"))
    p.add_argument("--endpoint", default=None, help="use this running S3 server (moto's keys)")
    p.add_argument("--bucket", default="bench", help="bucket to upload to (default bench)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per epoch before a stall")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default="remote", help="stem of the result files")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wdsloader-bench-data"))
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers")
    p.add_argument("--note", default=None)
    p.add_argument("--render", metavar="JSON", default=None, help="only rewrite .md and .png")
    p.add_argument(
        "--update",
        action="append",
        default=[],
        metavar="FILE",
        help="also put the tables between <!-- remote-bench:start/end --> in FILE (README.md, "
        "docs/speed.md); repeatable",
    )
    return p.parse_args(argv)


def build_and_upload(
    run: local.Runner, args: argparse.Namespace, server: S3Server, systems: list[str]
) -> tuple[dict[str, int], dict[str, list[tuple[str, int]]], dict[str, Any]]:
    """Each format's dataset built (once, in --data) and uploaded under ``s3://bench/<fmt>``;
    returns the bytes of each format, the objects of each (key path, size) and the builds."""
    import s3fs

    bucket = args.bucket
    fs = s3fs.S3FileSystem(**server.options())
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    sizes: dict[str, int] = {}
    objects: dict[str, list[tuple[str, int]]] = {}
    builds: dict[str, Any] = {}
    for fmt in sorted({readers.FORMAT[s] for s in systems} | {"ours"}):  # ours: the ceiling
        path, res = local.ensure_dataset(
            run, args.data, WORKLOAD, args.n, args.shard_mib * 2**20, fmt, 1
        )
        builds[fmt] = res
        if res is not None and "error" in res:
            continue
        fs.put(path.rstrip("/") + "/", f"{bucket}/{fmt}", recursive=True)
        objects[fmt] = []
        for dirpath, _, files in os.walk(path):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), path).replace(os.sep, "/")
                objects[fmt].append((f"/{bucket}/{fmt}/{rel}", os.path.getsize(path + "/" + rel)))
        sizes[fmt] = sum(size for _, size in objects[fmt])
        print(f"  uploaded {fmt}: {len(objects[fmt])} objects, {sizes[fmt] / 1e6:,.1f} MB")
    return sizes, objects, builds


def best_ceiling(
    address: tuple[str, int], objects: list[tuple[str, int]], key: str
) -> dict[str, Any] | None:
    """The better of 8 connections x 16 MiB ranges and 16 x 8 MiB over ``objects``."""
    if not objects:
        return None
    tries = [
        ceiling(address, objects, key, 16 * 2**20, 8),
        ceiling(address, objects, key, 8 * 2**20, 16),
    ]
    return max(tries, key=lambda t: t["mb_per_s"])


def one_epoch(
    run: local.Runner,
    proxy: LatencyProxy,
    server: S3Server,
    system: str,
    workers: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One cold epoch of ``system`` in a fresh process through ``proxy`` (an empty cache)."""
    fmt = readers.FORMAT[system]
    cache = tempfile.mkdtemp(prefix=f"wds-remote-cache-{system}-")
    spec = {
        "task": "read",
        "system": system,
        "workload": WORKLOAD,
        "n": args.n,
        "path": f"s3://{args.bucket}/{fmt}",
        "workers": workers,
        "max_seconds": None,
        "storage_options": server.options(proxy.url),
        "cache_dir": cache,
    }
    run.env.update(server.env(proxy.url))
    proxy.snapshot(reset=True)
    watch = CpuWatch(server.pid)
    watch.start()
    try:
        result = run(spec, f"{proxy.profile.name} {system} W{workers}", timeout=args.timeout)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result["machine_cpu"] = watch.stop()  # the whole process's run, its imports included
    stats = proxy.snapshot(reset=True, log=True)
    log_path = os.path.join(run.raw, f"{run.count:04d}-requests.json")
    with open(log_path, "w") as f:  # the request log: t, connection, kind, path, range
        json.dump(stats.pop("log"), f)
    result["proxy"] = {**stats, "log_file": os.path.basename(log_path)}
    result["spec"].pop("storage_options", None)  # the server's dummy keys stay out of results
    return result


def measure(args: argparse.Namespace, systems: list[str], runner: local.Runner) -> dict[str, Any]:
    """Start the server, build and upload, then every profile's ceiling and epochs."""
    profiles = [PROFILES[p.strip()] for p in args.profiles.split(",") if p.strip()]
    counts = [int(w) for w in args.workers.split(",")]
    server = S3Server.existing(args.endpoint) if args.endpoint else S3Server(args.server)
    with server:
        print(f"S3 server: {server.kind} on 127.0.0.1:{server.port}", flush=True)
        sizes, objects, builds = build_and_upload(runner, args, server, systems)
        ours_tars = [o for o in objects.get("ours", []) if o[0].endswith(".tar")]
        warm = warm_up(server, ours_tars) if ours_tars else []
        if warm:
            per_mb = ", ".join(report._n(w["ms_per_mb"], ".2f") for w in warm)
            print(f"server warm-up: {len(warm)} rounds, CPU ms/MB {per_mb}", flush=True)
        bare = best_ceiling(server.address, ours_tars, server.key)
        out: dict[str, Any] = {"server": server.kind, "server_ceiling": bare, "profiles": {}}
        out["server_warm_up"] = warm
        out["tar_objects"] = ours_tars
        for profile in profiles:
            with LatencyProxy(server.address, profile) as proxy:
                top = best_ceiling(("127.0.0.1", proxy.port), ours_tars, server.key)
                proxy.snapshot(reset=True)
                print(f"{profile.name}: ceiling {report._n(top and top['mb_per_s'])} MB/s")
                runs: dict[str, dict[str, Any]] = {}
                for system in systems:
                    if readers.FORMAT[system] not in sizes:
                        continue
                    for nw in counts:
                        runs[f"{system} W{nw}"] = one_epoch(runner, proxy, server, system, nw, args)
                out["profiles"][profile.name] = {
                    "rtt_s": profile.rtt_s,
                    "rate_bytes_per_s": profile.rate_bytes_per_s,
                    "ceiling": top,
                    "runs": runs,
                }
    out.update(dataset_bytes=sizes, builds=builds)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            md = report.write(json.load(f), args.out, args.name)
        for path in args.update:
            print(f"{path}: {'updated' if report.update_block(path, md) else 'no markers'}")
        return 0
    t0 = time.perf_counter()
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    chosen, missing = local.select_systems(
        ",".join(s for s in systems if s not in ("ours_cache", "ours_obstore"))
    )
    systems = [s for s in systems if s in chosen or s in ("ours_cache", "ours_obstore")]
    runner = local.Runner(args.python, os.path.join(args.out, f"raw-{args.name}"), WORKER)
    doc: dict[str, Any] = {
        "note": args.note or local._git_commit(),
        "machine": local.describe_machine(),
        "config": {
            "n": args.n,
            "workload": local.WORKLOADS[WORKLOAD].title,
            "payload_bytes_per_sample": local.WORKLOADS[WORKLOAD].bytes_per_sample(args.n),
            "shard_bytes": args.shard_mib * 2**20,
            "batch_size": local.systems.BATCH,
            "workers": args.workers,
            "settings": report.SETTINGS,
        },
        "systems": systems,
        "missing": missing,
        **measure(args, systems, runner),
    }
    doc["elapsed_s"] = time.perf_counter() - t0
    md = report.write(doc, args.out, args.name)
    for path in args.update:
        print(f"{path}: {'updated' if report.update_block(path, md) else 'no markers'}")
    print(f"remote bench: done in {doc['elapsed_s']:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
