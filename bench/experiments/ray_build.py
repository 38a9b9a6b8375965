"""``build_shards`` on the local engine (1 and 2 worker processes) against Ray with N CPUs, on the
same realistic samples, into a local folder.

Each sample: ``emb`` float32[256], ``image`` uint8[32, 32, 3], an int label ``cls``, a JSON
``meta`` dict and ~200 characters of ``text`` (~4.6 KB of tar). The samples sit in a torch
map-style dataset (arrays generated once, in memory), so each engine's readers index it the same
way and only the builder and its engine are measured. Run (needs the ``ray`` extra):

    python bench/experiments/ray_build.py [--samples 8000] [--repeats 3] [--cpus 2]

Printed per engine: the median wall time of ``--repeats`` builds (interleaved, so that a noisy
neighbour hurts every engine alike), samples/s and MB/s from it, and CPU seconds: this process
with its pool workers (local) or the Ray workers and Ray's own daemons (raylet, GCS, ...) read
from /proc (Linux). "ray start" is ``ray.init``; "ray cold" the first build, which also starts
and warms the Ray worker processes (each imports torch, numpy and the builder). For the last Ray
build, Ray's own task timeline splits the tasks' time into submit, argument deserialisation,
execution (our ``write_block``) and storing the result, and gives how busy the CPU slots were.
Every build's bytes are checked against the others.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from build_shards import build_shards


class Realistic(torch.utils.data.Dataset):
    """``n`` realistic samples from arrays made once."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.emb = rng.standard_normal((n, 256)).astype(np.float32)
        self.image = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        self.words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]

    def __len__(self) -> int:
        return len(self.emb)

    def __getitem__(self, i: int) -> dict[str, Any]:
        text = " ".join(self.words[(i * 7 + j) % 8] for j in range(30 + i % 20))
        return {
            "__key__": f"s{i:08d}",
            "emb": self.emb[i],
            "image": self.image[i],
            "cls": i % 1000,
            "meta": {"source": "web", "width": 32, "tags": ["a", "b"][: 1 + i % 2]},
            "text": text,
        }


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def ray_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's descendants: Ray workers and Ray's daemons."""
    tree, hz = _children(), os.sysconf("SC_CLK_TCK")
    out = {"workers": 0.0, "daemons": 0.0}
    todo = list(tree.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            ticks = _ticks(pid)
        except OSError:
            continue
        name = cmd.split(b"\0", 1)[0]
        worker = name.startswith(b"ray::") and not name.endswith(b"Agent")  # ray::IDLE, ::task
        kind = "workers" if worker or b"default_worker.py" in cmd else "daemons"
        out[kind] += ticks / hz
    return out


def own_cpu() -> float:
    """CPU seconds of this process and its finished children (local pool workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.tar*")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def timed(build: Callable[[Path], Any], out: Path, ray_run: bool) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    before_own, before_ray = own_cpu(), ray_cpu() if ray_run else {}
    t0 = time.perf_counter()
    manifest = build(out)
    wall = time.perf_counter() - t0
    row = {"wall": wall, "own_cpu": own_cpu() - before_own, "bytes": manifest.num_bytes}
    if ray_run:
        after = ray_cpu()
        row.update({k: after[k] - before_ray[k] for k in after})
    return row


def task_phases(ray: Any, since: float) -> dict[str, float]:
    """Seconds per phase of the Ray tasks that started after ``since`` (``time.time()``), from
    Ray's own task timeline: submit, argument deserialisation, execution, storing the result."""
    out: dict[str, float] = {}
    for event in ray.timeline():
        if (
            "dur" in event
            and event["ts"] >= since * 1e6
            and event["name"].startswith(("task:", "submit_task"))
        ):
            out[event["name"]] = out.get(event["name"], 0.0) + event["dur"] / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    ap.add_argument("--shard-max-count", type=int, default=500)
    ap.add_argument("--block-size", type=int, default=1000)
    args = ap.parse_args()

    import ray

    data = Realistic(args.samples)
    opts = dict(
        splits={"train": 0.9, "val": 0.1},
        shard_max_count=args.shard_max_count,
        block_size=args.block_size,
    )
    tmp = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    engines: dict[str, Callable[[Path], Any]] = {
        "local, 1 worker": lambda out: build_shards(data, out, **opts),
        "local, 2 workers": lambda out: build_shards(data, out, workers=2, **opts),
        f"ray, {args.cpus} CPUs": lambda out: build_shards(data, out, engine="ray", **opts),
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    digests: dict[str, set[str]] = {name: set() for name in engines}
    phases: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        start = time.perf_counter() - t0
        ray_name = f"ray, {args.cpus} CPUs"
        cold = timed(engines[ray_name], tmp / "cold", True)
        for _ in range(args.repeats):
            for name, build in engines.items():
                out = tmp / name.replace(" ", "").replace(",", "-")
                since = time.time()
                rows[name].append(timed(build, out, name == ray_name))
                digests[name].add(digest(out))
                if name == ray_name:
                    time.sleep(1.5)  # the task events reach the timeline about once a second
                    phases = task_phases(ray, since)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    n = args.samples
    print(
        f"{n} samples, {rows[ray_name][0]['bytes'] / 1e6:.1f} MB of shards, "
        f"{n // args.block_size} blocks; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"ray start (ray.init): {start:.1f} s; ray cold (first build, starts the workers): "
        f"{cold['wall']:.1f} s = {n / cold['wall']:,.0f} samples/s"
    )
    print(f"{'engine':<18}{'wall s':>8}{'samples/s':>11}{'MB/s':>7}{'CPU s':>7}  CPU split")
    base = statistics.median(r["wall"] for r in rows["local, 1 worker"])
    for name, rs in rows.items():
        wall = statistics.median(r["wall"] for r in rs)
        med = min(rs, key=lambda r: abs(r["wall"] - wall))
        cpu = med["own_cpu"] + med.get("workers", 0.0) + med.get("daemons", 0.0)
        split = (
            f"driver {med['own_cpu']:.1f}, workers {med['workers']:.1f}, "
            f"ray daemons {med['daemons']:.1f}"
            if "workers" in med else "this process + pool workers"
        )  # fmt: skip
        print(f"{name:<18}{wall:>8.2f}{n / wall:>11,.0f}{med['bytes'] / 1e6 / wall:>7.1f}"
              f"{cpu:>7.1f}  {split}; x{base / wall:.2f} of local 1")  # fmt: skip
    last = rows[ray_name][-1]
    busy = phases.get("task:execute", 0.0) / (last["wall"] * args.cpus)
    print(f"last ray build: task slots busy {busy:.0%} of wall x CPUs; Ray's per-task phases "
          + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(phases.items())))  # fmt: skip
    same = len(set().union(*digests.values())) == 1
    print(f"bytes identical across engines and repeats: {same}")


if __name__ == "__main__":
    main()
