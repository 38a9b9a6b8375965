"""The benchmark suite: wdsloader against its peers on the same data and the same work.

    python bench/run.py                 # full run (make bench), ~15-20 min on 2 cores
    python bench/run.py --quick         # small sizes, 1 repeat (seconds to a minute)
    python bench/run.py --only ours,webdataset,raw --workloads embed --parts read
    python bench/run.py --remote        # from S3 on loopback behind a latency proxy (bench/remote)
    python bench/run.py --parts busy --busy matmul  # the consumer works per batch (bench/busy.py)
    make bench-quick                    # the same through .venv-bench (peers installed)

Generates the workloads deterministically (bench/workloads.py), writes each with our builder
and with each peer's writer, then reads one shuffled epoch per (workload, system, num_workers)
in a fresh subprocess (bench/worker.py), round-robin over the repeats, and reports medians:
samples/s, MB/s (payload bytes), time to first batch, peak RSS, exactly-once and shuffle
quality, and each system's share of the raw limit (a readinto loop over the same files on a
warm page cache, measured in the same run); builder throughput and bytes on disk; our loader's RSS at N and 10 N samples; time to
first batch through S3 on loopback (moto). Missing peers are reported, never replaced.

Results: OUT/results.json, OUT/results.md, OUT/chart.png; per-run JSON and logs in OUT/raw/.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import busy, report, systems  # noqa: E402
from bench.workloads import BUILD_N, MEMORY_SMALL_FRACTION, WORKLOADS  # noqa: E402

ALL_SYSTEMS = (
    "ours", "ours_adopted", "webdataset", "mosaic", "litdata", "litdata_bd0", "hf", "raw_read",
    "raw_batches", "raw_tarfile",
)  # fmt: skip
DEFAULT_WORKLOADS = "embed,embed_running,embed_few,embed_arrays,blobs,jpeg"
# workloads read with every num_workers of --workers (the others with 0 only)
MULTI_WORKLOADS = ("embed", "embed_arrays", "jpeg")
PARTS = ("read", "busy", "build", "memory", "s3", "gpu")
WORKER = os.path.join(ROOT, "bench", "worker.py")
VERSIONED = (
    "wdsloader",
    "torch",
    "numpy",
    "fsspec",
    "webdataset",
    "mosaicml-streaming",
    "litdata",
    "datasets",
    "s3fs",
    "moto",
    "matplotlib",
)
# environment of every worker: no network calls at construction (LitData asks PyPI for a newer
# version, datasets may resolve the hub), no progress bars in the logs
WORKER_ENV = {
    "LITDATA_DISABLE_VERSION_CHECK": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "PYTHONWARNINGS": "ignore",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    p.add_argument("--repeats", type=int, default=None, help="runs per measurement (default 3)")
    p.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="at most this many samples per workload (a smoke run; numbers mean little)",
    )
    p.add_argument(
        "--only",
        default=None,
        help="comma-separated systems: ours, ours_adopted (ours on webdataset-written shards "
        "adopted by build_shards.adopt), webdataset, mosaic, litdata (litdata and litdata_bd0), "
        "hf, raw (raw_read, raw_batches and raw_tarfile); default: all",
    )
    p.add_argument(
        "--workloads",
        default=DEFAULT_WORKLOADS,
        help=f"comma-separated, of: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOADS})",
    )
    p.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    p.add_argument(
        "--busy",
        default=",".join(busy.KINDS),
        help="the busy part's consumer work per batch, comma-separated: matmul (a ~5 ms numpy "
        "matmul on one thread), gil (~2 ms of pure Python holding the GIL); default both",
    )
    p.add_argument(
        "--busy-workloads",
        default=busy.WORKLOADS[0],
        help=f"the workloads of --workloads read by the busy part (default {busy.WORKLOADS[0]})",
    )
    p.add_argument(
        "--workers",
        default="0,2",
        help=f"num_workers values for the workloads {', '.join(MULTI_WORKLOADS)} (others: 0)",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=10.0,
        help="stop a read after this many seconds (reported as a partial epoch; default 10)",
    )
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "wdsloader-bench-data"),
        help="where generated datasets are kept between runs",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers")
    p.add_argument("--note", default=None, help="a line for the report (e.g. the commit measured)")
    p.add_argument(
        "--render",
        metavar="RESULTS_JSON",
        default=None,
        help="measure nothing: rewrite results.md and chart.png in --out from a results.json",
    )
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    return args


# ------------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------------


def describe_machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {}
    for dist in VERSIONED:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def select_systems(only: str | None) -> tuple[list[str], dict[str, str]]:
    """The systems to measure and, for the requested ones that cannot run, why not."""
    wanted: list[str] = []
    for name in (only or "ours,ours_adopted,webdataset,mosaic,litdata,hf,raw").split(","):
        name = name.strip()
        if name == "raw":
            names = ["raw_read", "raw_batches", "raw_tarfile"]
        elif name == "litdata":
            names = ["litdata", "litdata_bd0"]
        elif name in ALL_SYSTEMS:
            names = [name]
        elif name:
            raise SystemExit(f"unknown system {name!r}: choose from {', '.join(ALL_SYSTEMS)}, raw")
        else:
            names = []
        wanted += [n for n in names if n not in wanted]  # "litdata,litdata_bd0": each once
    missing = {}
    if "ours_adopted" in wanted and importlib.util.find_spec("webdataset") is None:
        missing["ours_adopted"] = "its shards are written by webdataset, which is not installed"
        wanted.remove("ours_adopted")
    for name in list(wanted):
        if name in systems.PEERS:
            module, dist = systems.PEERS[name]
            if importlib.util.find_spec(module) is None:
                missing[name] = f"not installed (pip install {dist}; make bench installs it)"
                wanted.remove(name)
    return wanted, missing


# ------------------------------------------------------------------------------------------------
# running workers
# ------------------------------------------------------------------------------------------------


class Runner:
    """Runs worker subprocesses and keeps their results and logs under ``raw``."""

    def __init__(self, python: str, raw: str, worker: str = WORKER) -> None:
        self.python = python
        self.raw = raw
        self.worker = worker
        os.makedirs(os.path.join(raw, "logs"), exist_ok=True)
        self.env = dict(os.environ, **WORKER_ENV)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.count = 0
        self.precompile()

    def precompile(self) -> None:
        """Write the bytecode of this tree's packages (with ``PYTHONDONTWRITEBYTECODE`` set, as
        on some machines, every fresh worker would otherwise compile the modules it imports on
        first use inside its timed window, while the peers' installed modules come compiled)."""
        dirs = [os.path.join(ROOT, d) for d in ("wdsloader", "build_shards", "bench")]
        subprocess.run(
            [self.python, "-m", "compileall", "-q", *filter(os.path.isdir, dirs)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )

    def __call__(self, spec: dict[str, Any], label: str, timeout: float) -> dict[str, Any]:
        self.count += 1
        stem = f"{self.count:04d}-{label.replace(' ', '_').replace('/', '-')}"
        result_path = os.path.join(self.raw, f"{stem}.json")
        log_path = os.path.join(self.raw, "logs", f"{stem}.log")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            try:
                proc = subprocess.run(
                    [self.python, self.worker, json.dumps(spec), result_path],
                    env={**self.env, **busy.ENV} if spec.get("busy") else self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout,
                    check=False,
                )
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = None
        wall = time.perf_counter() - t0
        result: dict[str, Any]
        if rc is None:
            result = {"error": f"timed out after {timeout:.0f} s", "spec": spec}
        else:
            try:
                with open(result_path) as f:
                    result = json.load(f)
            except (OSError, json.JSONDecodeError):
                result = {"error": f"worker exited {rc} without a result (see {log_path})"}
                result["spec"] = spec
        result["wall_s"] = wall
        result["label"] = label
        with open(result_path, "w") as f:
            json.dump(result, f, default=str)
        status = result.get("error") or _summary(result)
        print(f"  [{self.count}] {label}: {status} ({wall:.1f} s)", flush=True)
        return result


def _summary(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    rate = result.get("samples_per_s")
    text = f"{rate:,.0f} samples/s" if rate else "?"
    if result.get("ttfb_s") is not None:
        text += f", first batch {result['ttfb_s']:.3f} s"
    if result.get("complete") is False:
        text += f" (partial: {result['samples']:,} of {result['n_total']:,})"
    if result.get("disk_over_payload"):
        text += f", disk/payload {result['disk_over_payload']:.2f}"
    return text


# ------------------------------------------------------------------------------------------------
# datasets
# ------------------------------------------------------------------------------------------------


def dataset_dir(data: str, workload: str, n: int, shard_bytes: int, fmt: str) -> str:
    return os.path.join(data, f"{workload}-{n}-{shard_bytes >> 20}MiB", fmt)


def ensure_dataset(
    run: Runner, data: str, workload: str, n: int, shard_bytes: int, fmt: str, workers: int
) -> tuple[str, dict[str, Any] | None]:
    """Build (once; kept in ``data``) the dataset of ``workload`` in format ``fmt``."""
    path = dataset_dir(data, workload, n, shard_bytes, fmt)
    stamp = path + ".done.json"
    if os.path.exists(stamp) and os.path.isdir(path):
        with open(stamp) as f:
            return path, json.load(f)
    spec = {
        "task": "write",
        "system": fmt,
        "workload": workload,
        "n": n,
        "out": path,
        "workers": workers if fmt == "ours" else 1,
        "shard_bytes": shard_bytes,
    }
    result = run(spec, f"build {workload} {fmt}", timeout=1800)
    if "error" in result:
        shutil.rmtree(path, ignore_errors=True)
        return path, result
    with open(stamp, "w") as f:
        json.dump(result, f)
    return path, result


def warm(paths: list[str]) -> None:
    """Read every file under ``paths`` once (outside any timing): the run after it starts from
    a warm page cache."""
    buf = bytearray(8 * 2**20)
    for root in paths:
        for dirpath, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    while f.readinto(buf):
                        pass


# ------------------------------------------------------------------------------------------------
# S3 on loopback
# ------------------------------------------------------------------------------------------------


def s3_runs(
    run: Runner, local: str, n: int, repeats: int, max_seconds: float | None
) -> dict[str, Any] | str:
    """Time to first batch (and throughput) of our loader reading ``local`` through a moto
    S3 server on 127.0.0.1, with the rate at which moto serves one whole shard for context;
    a string says why it was skipped."""
    for module in ("moto", "s3fs"):
        if importlib.util.find_spec(module) is None:
            return f"skipped: {module} not installed"
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
        }
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        fs.mkdir("bench")
        fs.put(local, "bench/ds", recursive=True)
        shard = max(systems.tar_files(local), key=os.path.getsize)
        remote = "bench/ds/" + os.path.relpath(shard, local).replace(os.sep, "/")
        t0 = time.perf_counter()
        got = len(fs.cat_file(remote))
        get_rate = got / (time.perf_counter() - t0) / 1e6
        results = []
        for r in range(repeats):
            spec = {
                "task": "read",
                "system": "ours",
                "workload": "embed",
                "n": n,
                "path": "s3://bench/ds",
                "workers": 0,
                "max_seconds": max_seconds,
                "storage_options": options,
            }
            results.append(run(spec, f"s3 embed ours W0 #{r}", timeout=600))
        return {"runs": results, "moto_get_mb_per_s": get_rate, "moto_get_bytes": got}
    finally:
        server.stop()


def _git_commit() -> str | None:
    """``code: <commit>`` of the tree measured, when it is a git checkout (read-only)."""
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return f"code: {out.stdout.strip()}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def write_reports(doc: dict[str, Any], out: str) -> str:
    """Write results.json, results.md and chart.png under ``out``; returns the markdown."""
    if isinstance(doc.get("s3"), dict):  # moto's dummy credentials stay out of the artifacts
        for r in doc["s3"]["runs"]:
            options = r.get("spec", {}).get("storage_options")
            if options:
                r["spec"]["storage_options"] = {"client_kwargs": options.get("client_kwargs")}
    doc["summary"] = report.summarize(doc)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = report.markdown(doc)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    chart = report.chart(doc, os.path.join(out, "chart.png"))
    print(md)
    print(chart or "chart: chart.png written")
    return md


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            write_reports(json.load(f), args.out)
        return 0
    t_start = time.perf_counter()
    quick = args.quick
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}: choose from {', '.join(PARTS)}")
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in names:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}: choose from {', '.join(WORKLOADS)}")
    worker_counts = [int(w) for w in args.workers.split(",")]
    chosen, missing = select_systems(args.only)
    shard_bytes = 4 * 2**20 if quick else systems.SHARD_BYTES
    build_workers = 1  # the datasets to read; 2 spawned workers did not pay off on 2 cores
    raw_dir = os.path.join(args.out, "raw")
    shutil.rmtree(raw_dir, ignore_errors=True)
    run = Runner(args.python, raw_dir)
    machine = describe_machine()
    print(
        f"wdsloader bench: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB; "
        f"systems {', '.join(chosen)}; missing: {missing or 'none'}",
        flush=True,
    )
    sizes = {w: min(WORKLOADS[w].n(quick), args.max_samples or 2**62) for w in names}
    busy_kinds = [k.strip() for k in args.busy.split(",") if k.strip()]
    if set(busy_kinds) - set(busy.KINDS):
        raise SystemExit(f"unknown --busy {args.busy!r}: choose from {', '.join(busy.KINDS)}")
    busy_names = [w for w in args.busy_workloads.split(",") if w.strip() in names]

    def reads(workload: str, system: str) -> bool:
        return workload in systems.ONLY_WORKLOADS.get(system, (workload,))

    formats: dict[str, set[str]] = {w: set() for w in names}
    for w in names:
        if "read" in parts or ("busy" in parts and w in busy_names):
            formats[w] |= {systems.READ_FORMAT[s] for s in chosen if reads(w, s)}
        if "ours" in chosen and parts & {"memory", "s3", "gpu"} and w == "embed":
            formats[w].add("ours")

    # 1. datasets (built once, kept in --data)
    print("datasets:", flush=True)
    paths: dict[tuple[str, str], str] = {}
    builds: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for w in names:
        for fmt in sorted(formats[w]):
            if fmt in failed:
                continue
            path, res = ensure_dataset(run, args.data, w, sizes[w], shard_bytes, fmt, build_workers)
            builds[f"{w}/{fmt}"] = res
            if res is not None and "error" in res:
                failed[fmt] = f"its writer failed: {res['error'].splitlines()[0]}"
            else:
                paths[(w, fmt)] = path
    small_n = max(systems.BATCH, sizes.get("embed", 0) // MEMORY_SMALL_FRACTION)
    want_small = "embed" in names and "ours" in chosen and parts & {"memory", "s3"}
    if want_small:
        path, res = ensure_dataset(
            run, args.data, "embed", small_n, shard_bytes, "ours", build_workers
        )
        builds["embed-small/ours"] = res
        paths[("embed-small", "ours")] = path
    for s in list(chosen):
        if systems.READ_FORMAT[s] in failed and s not in missing:
            missing[s] = failed[systems.READ_FORMAT[s]]
            chosen.remove(s)

    # 2. the measurements, round-robin over repeats
    def read_spec(w: str, s: str, nw: int) -> dict[str, Any] | None:
        if not reads(w, s):
            return None
        return {
            "task": "raw" if s in systems.RAW else "read",
            "system": s,
            "workload": w,
            "n": sizes[w],
            "path": paths[(w, systems.READ_FORMAT[s])],
            "workers": nw,
            "max_seconds": args.max_seconds,
        }

    runs: list[tuple[str, dict[str, Any]]] = []
    if "read" in parts:
        for w in names:
            for s in chosen:
                multi = w in MULTI_WORKLOADS and s in systems.MULTI_WORKER
                for nw in worker_counts if multi else [0]:
                    spec = read_spec(w, s, nw)
                    if spec is not None:
                        runs.append((f"read {w} {s} W{nw}", spec))
    if "busy" in parts:
        runs += busy.specs(busy_kinds, busy_names, chosen, worker_counts, read_spec)
    if "memory" in parts and want_small:
        for w, n in (("embed-small", small_n), ("embed", sizes["embed"])):
            spec = {
                "task": "read",
                "system": "ours",
                "workload": "embed",
                "n": n,
                "path": paths[(w, "ours")],
                "workers": 0,
                "max_seconds": None,
            }
            runs.append((f"memory {w} ours W0", spec))
    if "build" in parts:
        writers = [("ours", 1), ("ours", 2)] if "ours" in chosen else []
        writers += [(s, 1) for s in systems.WRITERS if s != "ours" and s in chosen]
        for w in [w for w in ("embed", "blobs") if w in names]:
            for s, nw in writers:
                spec = {
                    "task": "write",
                    "system": s,
                    "workload": w,
                    "n": BUILD_N[w]["quick" if quick else "full"],
                    "out": os.path.join(args.data, "build-scratch", f"{w}-{s}-{nw}"),
                    "workers": nw,
                    "shard_bytes": shard_bytes,
                    "remove": True,
                }
                runs.append((f"build {w} {s} w{nw}", spec))
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in runs}
    for r in range(args.repeats):
        order = list(runs)
        random.Random(r).shuffle(order)
        print(f"round {r + 1}/{args.repeats} ({len(order)} runs):", flush=True)
        for label, spec in order:
            timeout = 1800 if spec["task"] == "write" else (args.max_seconds or 600) + 300
            if "path" in spec:
                # the datasets together outgrow the page cache (~16 GB of 23.5 GiB RAM in the
                # full run): read this run's files once more, so that each read starts warm
                warm([spec["path"]])
            results[label].append(run(spec, label, timeout=timeout))

    # 3. S3 on loopback, GPU feed
    s3: dict[str, Any] | str = "skipped: not requested"
    if "s3" in parts:
        if want_small:
            print("S3 on loopback:", flush=True)
            s3 = s3_runs(
                run, paths[("embed-small", "ours")], small_n, args.repeats, args.max_seconds
            )
        else:
            s3 = "skipped: needs the embed workload and ours"
    gpu: dict[str, Any] = {"skipped": "not requested"}
    if "gpu" in parts and "embed" in names and "ours" in chosen:
        gpu = run(
            {"task": "gpu", "path": paths[("embed", "ours")], "workload": "embed"},
            "gpu feed",
            timeout=600,
        )

    doc = {
        "note": args.note or _git_commit(),
        "machine": machine,
        "config": {
            "quick": quick,
            "repeats": args.repeats,
            "max_seconds": args.max_seconds,
            "workloads": {
                w: {
                    "n": sizes[w],
                    "payload_bytes_per_sample": WORKLOADS[w].bytes_per_sample(sizes[w]),
                    "title": WORKLOADS[w].title,
                }
                for w in names
            },
            "shard_bytes": shard_bytes,
            "batch_size": systems.BATCH,
            "build_n": {w: n["quick" if quick else "full"] for w, n in BUILD_N.items()},
            "memory_n": [small_n, sizes.get("embed")],
            "settings": report.SETTINGS,
            "busy": {k: busy.WORK_TITLES[k] for k in busy_kinds} if "busy" in parts else {},
        },
        "systems": chosen,
        "missing": missing,
        "dataset_builds": builds,
        "runs": results,
        "s3": s3,
        "gpu": gpu,
        "elapsed_s": time.perf_counter() - t_start,
    }
    write_reports(doc, args.out)
    print(f"bench: done in {time.perf_counter() - t_start:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    if "--remote" in sys.argv[1:]:  # the remote mode has its own options (bench/remote/run.py)
        from bench.remote import run as remote

        raise SystemExit(remote.main([a for a in sys.argv[1:] if a != "--remote"]))
    raise SystemExit(main())
