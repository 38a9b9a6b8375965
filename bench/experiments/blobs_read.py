"""Large byte blobs read in-process (``num_workers=0``): our loader with the blob as ``bytes``
(the default) and declared ``uint8`` (one copy into the batch), LitData when importable, and
the raw limit (a warm ``readinto`` loop over the same shard files), in one run.

    PYTHONPATH=$PWD python bench/experiments/blobs_read.py [--n 1024] [--repeats 5]

Every dataset is read once untimed first (a warm page cache, like the raw loop). Each system
is timed on a new loader's first pass and on a loader's second pass (``2nd``: its buffers kept
from the first). Reports per system the best of ``--repeats`` interleaved runs: samples/s,
payload MB/s, CPU seconds per 1,000 samples, the share of the raw limit (samples/s and, as
the machine may be shared, CPU time too) and minor page faults per sample (new memory the
pass touched: a 160 KiB blob is 40 pages); the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from bench import systems
from bench.workloads import WORKLOADS

WORKLOAD = "blobs"


def build_uint8(n: int, out: str, shard_bytes: int, schema: dict[str, Any] | None = None) -> None:
    """Our shards of the blobs workload with ``blob`` declared ``uint8`` (or ``schema``)."""
    from bench.torch_source import GeneratedTorchDataset
    from build_shards import build_shards

    count = max(1, shard_bytes // (WORKLOADS[WORKLOAD].field_bytes + 1024))
    build_shards(
        GeneratedTorchDataset(WORKLOAD, n),
        out,
        schema={"blob": {"dtype": "uint8"}} if schema is None else schema,
        shard_max_count=count,
        shard_max_bytes=shard_bytes,
        block_size=count,
    )


def ensure(data: str, n: int, shard_bytes: int) -> dict[str, str]:
    """The datasets to read: {system: path} (built where missing)."""
    root = os.path.join(data, f"blobs-{n}-{shard_bytes // 2**20}MiB")
    paths = {"ours_bytes": os.path.join(root, "ours"), "ours_uint8": os.path.join(root, "ours_u8")}
    if not os.path.exists(paths["ours_bytes"]):  # the blob as bytes: no declaration
        build_uint8(n, paths["ours_bytes"], shard_bytes, schema={})
    if not os.path.exists(paths["ours_uint8"]):
        tmp = paths["ours_uint8"] + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        build_uint8(n, tmp, shard_bytes)
        os.rename(tmp, paths["ours_uint8"])
    try:
        import litdata  # noqa: F401

        lit = os.path.join(root, "litdata")
        if not os.path.exists(lit):
            systems.write_litdata(WORKLOAD, n, lit, 1, shard_bytes)
        paths["litdata"] = lit
    except ImportError:
        pass
    return paths


def _files(path: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def _read_all(path: str) -> None:
    for name in _files(path):
        with open(name, "rb") as f:
            while f.read(2**22):
                pass


Timing = tuple[int, float, float, int]  # items, wall seconds, CPU seconds, minor page faults


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _pass(items: Iterable[Any], count: Callable[[Any], int]) -> Timing:
    """(items, wall seconds, CPU seconds, page faults) of one pass over ``items``."""
    t, c, f = time.perf_counter(), time.process_time(), _faults()
    n = sum(count(x) for x in items)
    return n, time.perf_counter() - t, time.process_time() - c, _faults() - f


def raw_batch_arrays(path: str, pool: list[Any]) -> Iterable[int]:
    """The shard files read 1 MiB at a time (``readinto``) into the batch-sized arrays of
    ``pool`` in turn (faulted in beforehand): the bound of a loader that hands each batch out in
    memory of its own, reused (one copy from the page cache, into memory larger than the
    caches)."""
    batch_bytes = len(pool[0]) - 2**20
    k, pos = 0, 0
    for name in systems.tar_files(path):
        with open(name, "rb", buffering=0) as f:
            while True:
                got = f.readinto(memoryview(pool[k])[pos : pos + 2**20])
                if not got:
                    break
                yield got
                pos += got
                if pos >= batch_bytes:
                    k, pos = (k + 1) % len(pool), 0


def _samples(batch: Any) -> int:
    return len(batch["label"])


def first_pass(read: Callable[..., Iterable[Any]], path: str) -> Timing:
    """A new loader's first pass (loader creation included)."""
    t, c, f = time.perf_counter(), time.process_time(), _faults()
    n, _, _, _ = _pass(read(WORKLOAD, path, 0), _samples)
    return n, time.perf_counter() - t, time.process_time() - c, _faults() - f


def second_pass(read: Callable[..., Iterable[Any]], path: str) -> Timing:
    """A loader's second pass (its buffers kept from the first, untimed, one)."""
    loader = read(WORKLOAD, path, 0)
    _pass(loader, _samples)
    return _pass(loader, _samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shard-bytes", type=int, default=4 * 2**20)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "wdsloader-bench-data"))
    args = p.parse_args()
    paths = ensure(args.data, args.n, args.shard_bytes)
    per_sample = WORKLOADS[WORKLOAD].bytes_per_sample(args.n)
    for path in paths.values():
        _read_all(path)
    shard_bytes = sum(os.path.getsize(f) for f in systems.tar_files(paths["ours_uint8"]))
    batch_bytes = systems.BATCH * shard_bytes // args.n
    arrays = [np.ones(batch_bytes + 2**20, dtype=np.uint8) for _ in range(6)]
    runs: dict[str, Callable[[], Timing]] = {
        "raw_read": lambda: _pass(systems.raw_read(paths["ours_uint8"]), lambda b: b),
        "raw_batches": lambda: _pass(raw_batch_arrays(paths["ours_uint8"], arrays), lambda b: b),
    }
    for s, path in paths.items():
        read = systems.READ["litdata" if s == "litdata" else "ours"]
        runs[s] = functools.partial(first_pass, read, path)
        runs[s + " 2nd"] = functools.partial(second_pass, read, path)
    best: dict[str, Timing] = {}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            got = fn()
            if name not in best or got[1] < best[name][1]:
                best[name] = got
    raw_bytes, raw_s, raw_cpu, _ = best["raw_read"]
    raw_mb_s = raw_bytes / raw_s / 1e6
    raw_rate, raw_cpu_rate = args.n / raw_s, args.n / max(raw_cpu, 1e-9)  # samples the loop read
    out: dict[str, dict[str, float]] = {}
    print(
        f"raw_read (warm readinto, 1 MiB buffer): {raw_mb_s:,.0f} MB/s of shard bytes, "
        f"{raw_rate:,.0f} samples/s, {raw_cpu / args.n * 1e3:.3f} CPU s/1k samples"
    )
    n_bytes, b_s, b_cpu, _ = best["raw_batches"]
    print(
        f"raw_batches (warm readinto, 6 reused batch-sized arrays): {n_bytes / b_s / 1e6:,.0f} "
        f"MB/s, {raw_s / b_s:.1%} of raw ({raw_cpu / b_cpu:.1%} by CPU time): the bound of "
        "one copy into batch memory"
    )
    for name, (n, wall, cpu, faults) in best.items():
        if name.startswith("raw_"):
            continue
        mb_s = n * per_sample / wall / 1e6
        out[name] = {
            "samples_per_s": n / wall,
            "mb_per_s": mb_s,
            "cpu_s_per_1k": cpu / n * 1e3,
            "share_of_raw": n / wall / raw_rate,
            "cpu_share_of_raw": n / cpu / raw_cpu_rate,
            "page_faults_per_sample": faults / n,
        }
        print(
            f"{name:16s} {n / wall:7,.0f} samples/s {mb_s:6,.0f} MB/s  "
            f"{cpu / n * 1e3:6.3f} CPU s/1k  {n / wall / raw_rate:5.1%} of raw "
            f"({n / cpu / raw_cpu_rate:5.1%} by CPU time)  {faults / n:5.1f} faults/sample"
        )
    if "litdata" in out:
        for tail in ("", " 2nd"):
            lit = out["litdata" + tail]["samples_per_s"]
            for name in ("ours_bytes", "ours_uint8"):
                ratio = out[name + tail]["samples_per_s"] / lit
                print(f"{name + tail} / litdata{tail}: {ratio:.2f}x")
    bound = {"raw_batches_share": raw_s / b_s, "raw_batches_cpu_share": raw_cpu / b_cpu}
    print(json.dumps({"raw_mb_s": raw_mb_s, **bound, **out}))


if __name__ == "__main__":
    main()
