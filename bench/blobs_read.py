"""Large byte blobs read in-process (``num_workers=0``): our loader with the blob as ``bytes``
(the default) and declared ``uint8`` (one copy into the batch), LitData when importable, and
the raw limit (a warm ``readinto`` loop over the same shard files), in one run.

    PYTHONPATH=$PWD python bench/blobs_read.py [--n 1024] [--repeats 5]

Every dataset is read once untimed first (a warm page cache, like the raw loop). Reports per
system the best of ``--repeats`` interleaved runs: samples/s, payload MB/s, CPU seconds per
1,000 samples, and the share of the raw limit; the ratios are what to compare (shared cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from bench import systems
from bench.workloads import WORKLOADS

WORKLOAD = "blobs"


def build_uint8(n: int, out: str, shard_bytes: int) -> None:
    """Our shards of the blobs workload with ``blob`` declared ``uint8``."""
    from bench.torch_source import GeneratedTorchDataset
    from build_shards import build_shards

    count = max(1, shard_bytes // (WORKLOADS[WORKLOAD].field_bytes + 1024))
    build_shards(
        GeneratedTorchDataset(WORKLOAD, n),
        out,
        schema={"blob": {"dtype": "uint8"}},
        shard_max_count=count,
        shard_max_bytes=shard_bytes,
        block_size=count,
    )


def ensure(data: str, n: int, shard_bytes: int) -> dict[str, str]:
    """The datasets to read: {system: path} (built where missing)."""
    root = os.path.join(data, f"blobs-{n}-{shard_bytes // 2**20}MiB")
    paths = {"ours_bytes": os.path.join(root, "ours"), "ours_uint8": os.path.join(root, "ours_u8")}
    if not os.path.exists(paths["ours_bytes"]):
        systems.write_ours(WORKLOAD, n, paths["ours_bytes"], 1, shard_bytes)
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


def timed(fn: Callable[[], Iterable[Any]], count: Callable[[Any], int]) -> tuple[int, float, float]:
    """(items, wall seconds, CPU seconds) of one pass."""
    t, c = time.perf_counter(), time.process_time()
    items = sum(count(x) for x in fn())
    return items, time.perf_counter() - t, time.process_time() - c


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
    runs: dict[str, Callable[[], Iterable[Any]]] = {
        "raw_read": lambda: systems.raw_read(paths["ours_uint8"]),
        **{
            s: (
                lambda s=s: systems.READ["litdata" if s == "litdata" else "ours"](
                    WORKLOAD, paths[s], 0
                )
            )
            for s in paths
        },
    }
    best: dict[str, tuple[int, float, float]] = {}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            if name == "raw_read":
                got = timed(fn, lambda b: b)
            else:
                got = timed(fn, lambda batch: len(batch["label"]))
            if name not in best or got[1] < best[name][1]:
                best[name] = got
    raw_bytes, raw_s, _ = best["raw_read"]
    raw_mb_s = raw_bytes / raw_s / 1e6
    out = {}
    print(f"raw_read (warm readinto, 1 MiB buffer): {raw_mb_s:,.0f} MB/s of shard bytes")
    for name, (n, wall, cpu) in best.items():
        if name == "raw_read":
            continue
        mb_s = n * per_sample / wall / 1e6
        out[name] = {"samples_per_s": n / wall, "mb_per_s": mb_s, "cpu_s_per_1k": cpu / n * 1e3}
        print(
            f"{name:12s} {n / wall:9,.0f} samples/s {mb_s:8,.0f} MB/s  "
            f"{cpu / n * 1e3:6.3f} CPU s/1k samples  {mb_s / raw_mb_s:5.1%} of raw"
        )
    if "litdata" in out:
        for name in ("ours_bytes", "ours_uint8"):
            ratio = out[name]["samples_per_s"] / out["litdata"]["samples_per_s"]
            print(f"{name} / litdata: {ratio:.2f}x")
    print(json.dumps({"raw_mb_s": raw_mb_s, **out}))


if __name__ == "__main__":
    main()
