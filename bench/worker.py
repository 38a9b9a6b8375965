"""One measurement in a fresh process (so RSS, imports and start-up are per system).

    python bench/worker.py SPEC_JSON RESULT_PATH

``SPEC_JSON`` names the task (``read``, ``raw``, ``write`` or ``gpu``) and its parameters;
the result is written as JSON to ``RESULT_PATH``. ``bench/run.py`` is the only caller.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import sys
import time
import traceback
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from bench import busy, systems  # noqa: E402
from bench.workloads import WORKLOADS  # noqa: E402


def rss_now_mb() -> float:
    """Resident set size of this process now (Linux /proc), in MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak RSS (``ru_maxrss``) in MB: of this process, or of the largest reaped child."""
    peak = resource.getrusage(who).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def stream_metrics(order: np.ndarray, n_total: int, complete: bool) -> dict[str, Any]:
    """Exactly-once and shuffle quality of a stream of source positions.

    ``dist_over_n``: mean distance in source order between consecutive samples, over N
    (a uniform permutation gives 1/3). ``abs_rho``: |Spearman rho| between source order and
    stream order (0 for a uniform permutation). Both are computed on what was read, the whole
    epoch or, for a run stopped at the time limit, its first part.
    """
    n = len(order)
    uniq = np.unique(order)
    out: dict[str, Any] = {
        "duplicates": int(n - len(uniq)),
        "missing": int(n_total - len(uniq)) if complete else None,
        "exactly_once": bool(n == len(uniq) == n_total) if complete else None,
        "no_duplicates": bool(n == len(uniq)),
    }
    if n > 2:
        ranks = np.empty(n, dtype=np.float64)
        ranks[np.argsort(order, kind="stable")] = np.arange(n)
        pos = np.arange(n, dtype=np.float64)
        rho = np.corrcoef(ranks, pos)[0, 1]
        out["abs_rho"] = float(abs(rho))
        out["dist_over_n"] = float(np.abs(np.diff(order.astype(np.int64))).mean() / n_total)
    else:
        out["abs_rho"] = out["dist_over_n"] = None
    return out


def do_read(spec: dict[str, Any]) -> dict[str, Any]:
    system, workload, path = spec["system"], spec["workload"], spec["path"]
    workers, n_total = int(spec.get("workers", 0)), int(spec["n"])
    max_seconds = spec.get("max_seconds")
    wl = WORKLOADS[workload]
    payload_per_sample = wl.bytes_per_sample(n_total)
    t = time.perf_counter()
    systems.IMPORTS[system]()
    import torch  # noqa: F401 - every reader feeds torch

    import_s = time.perf_counter() - t
    consumer = busy.Consumer(spec["busy"]) if spec.get("busy") else None
    work_ms = consumer.calibrate() if consumer is not None else None
    clock = busy.StepClock()
    baseline = rss_now_mb()
    order: list[int] = []
    batches = 0
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    loader = systems.READ[system](workload, path, workers, spec.get("storage_options"))
    it = iter(loader)
    t_first = None
    stopped = False
    while True:
        t_ask = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        if t_first is None:
            t_first = time.perf_counter()
        clock.waited(time.perf_counter() - t_ask, first=batches == 0)
        order.extend(wl.order(batch))
        batches += 1
        if consumer is not None:
            clock.work(consumer)  # a training step's CPU work
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            stopped = True
            break
    t_end = time.perf_counter()
    # ours: the samples parsed one by one, off the whole-batch path (a layout cliff shows here)
    stats = getattr(getattr(loader, "loader", None), "stats", None)
    parsed = stats.get("parsed_samples") if isinstance(stats, dict) else None
    del it, loader
    gc.collect()
    cpu = _cpu_seconds() - cpu0  # worker processes counted once they are reaped
    samples = len(order)
    complete = not stopped or samples >= n_total  # the cap may strike on the last batch
    seconds = t_end - t0
    steady = None
    if t_first is not None and batches > 1 and t_end > t_first:
        first_batch = samples / batches  # batches are equal but for the last one
        steady = (samples - first_batch) / (t_end - t_first)
    return {
        "samples": samples,
        "batches": batches,
        "n_total": n_total,
        "complete": complete,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds else None,
        "cpu_seconds": cpu,
        "samples_per_cpu_s": samples / cpu if cpu > 0 else None,
        "steady_samples_per_s": steady,
        "parsed_samples": parsed,
        "mb_per_s": samples * payload_per_sample / seconds / 1e6 if seconds else None,
        "ttfb_s": (t_first - t0) if t_first is not None else None,
        "import_s": import_s,
        "rss_baseline_mb": baseline,
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_worker_mb": peak_rss_mb(resource.RUSAGE_CHILDREN) if workers else None,
        **stream_metrics(np.asarray(order, dtype=np.int64), n_total, complete),
        **(
            {}
            if consumer is None
            else {
                "busy": consumer.kind,
                "work_ms": work_ms,
                "blas_threads": consumer.blas_threads,
                **clock.result(t_end - t_first if t_first is not None else 0.0),
            }
        ),
    }


def do_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """A raw limit over our shard files: their bytes (``raw_read``, ``raw_batches``) or their
    members (``raw_tarfile``), no decoding. The same loop runs once untimed first, in this
    process, so the page cache is warm for exactly these reads. A run stopped at the time limit
    counts the samples it covered: the share of the file bytes read (members read / members
    per sample for ``raw_tarfile``)."""
    system, workload, path, n_total = spec["system"], spec["workload"], spec["path"], spec["n"]
    wl = WORKLOADS[workload]
    members_per_sample = len(wl.fields) + int(wl.label) + int(wl.meta)
    max_seconds = spec.get("max_seconds")
    total_bytes = sum(os.path.getsize(f) for f in systems.tar_files(path))
    for _ in systems.RAW["raw_read"](path):  # warm the page cache with these files
        pass
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    t_first = None
    nbytes = reads = 0
    complete = True
    args = (max(2**16, total_bytes * systems.BATCH // n_total),) if system == "raw_batches" else ()
    for got in systems.RAW[system](path, *args):
        if t_first is None:
            t_first = time.perf_counter()
        nbytes += got
        reads += 1
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            complete = False
            break
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    by_bytes = system != "raw_tarfile"
    if complete:
        samples = float(n_total)
    elif by_bytes:
        samples = n_total * nbytes / total_bytes
    else:
        samples = reads / members_per_sample
    return {
        "samples": samples,
        "n_total": n_total,
        "complete": complete,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "cpu_seconds": cpu,
        "samples_per_cpu_s": samples / cpu if cpu > 0 else None,
        "mb_per_s": samples * wl.bytes_per_sample(n_total) / seconds / 1e6,
        "file_mb_per_s": nbytes / seconds / 1e6 if by_bytes else None,
        "bytes_read": nbytes,
        "ttfb_s": (t_first - t0) if t_first is not None else None,
        "peak_rss_mb": peak_rss_mb(),
    }


def dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    return total


def do_write(spec: dict[str, Any]) -> dict[str, Any]:
    system, workload, n, out = spec["system"], spec["workload"], int(spec["n"]), spec["out"]
    workers = int(spec.get("workers", 1))
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    if system in ("ours", "adopted"):  # the builder's imports (torch too) stay out of the time
        import bench.torch_source  # noqa: F401
        import build_shards.adopt  # noqa: F401
        import build_shards.build  # noqa: F401
    if system != "ours":
        systems.IMPORTS[system]()
    import_s = time.perf_counter() - t
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    systems.WRITE[system](workload, n, out, workers, int(spec["shard_bytes"]))
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    disk = dir_bytes(out)
    payload = WORKLOADS[workload].payload_bytes(n)
    if spec.get("remove"):
        shutil.rmtree(out, ignore_errors=True)
    return {
        "samples": n,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "samples_per_s": n / seconds,
        "mb_per_s": payload / seconds / 1e6,
        "disk_bytes": disk,
        "payload_bytes": payload,
        "disk_over_payload": disk / payload,
        "import_s": import_s,
        "peak_rss_mb": peak_rss_mb(),
    }


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def do_gpu(spec: dict[str, Any]) -> dict[str, Any]:
    """Feed rate to the GPU: our loader through DevicePrefetcher (optional; needs CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    from wdsloader import create_loader
    from wdsloader.stream import DevicePrefetcher

    t0 = time.perf_counter()
    loader = create_loader(spec["path"], "train", batch_size=systems.BATCH, num_workers=2, seed=0)
    samples, t_first = 0, None
    for batch in DevicePrefetcher(loader, "cuda"):
        torch.cuda.synchronize()
        if t_first is None:
            t_first = time.perf_counter()
        samples += len(batch["__key__"])
    seconds = time.perf_counter() - t0
    return {
        "device": torch.cuda.get_device_name(0),
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "ttfb_s": t_first - t0 if t_first else None,
    }


TASKS = {"read": do_read, "raw": do_raw, "write": do_write, "gpu": do_gpu}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    try:
        result = TASKS[spec["task"]](spec)
        rc = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the orchestrator
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        rc = 1
    result["spec"] = spec
    with open(argv[2], "w") as f:
        json.dump(result, f, default=str)
    return rc


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # leave at once: a read stopped at the time limit may still have read-ahead threads or
    # workers in flight, and waiting for them would only add to the suite's wall time
    os._exit(code)
