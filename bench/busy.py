"""The busy consumer: the reading process does CPU work per batch, as a training step does.

    python bench/run.py --parts busy --busy matmul,gil --workloads embed_running

Two kinds of work, each the same fixed amount for every system:

- ``matmul``: a float32 ``MATMUL_N`` x ``MATMUL_N`` matmul in numpy on one BLAS thread (about
  5 ms on the bench machine). BLAS releases the GIL: a loader's threads may run beside it.
- ``gil``: a pure-Python loop of ``GIL_LOOPS`` iterations that holds the GIL (about 2 ms): a
  loader's threads in the same process wait for it, whatever they do in Python.

Each run reports samples/s and the share of the step time the consumer spent waiting for data
(in ``next`` on the loader, after the first batch); ``work_ms`` is the work alone, timed in the
same process before the read. The worker's BLAS is held to one thread by the environment
(:data:`ENV`, set before numpy is imported) and by threadpoolctl when it is installed.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

KINDS = ("matmul", "gil")
# make bench's busy workloads: the realistic sample (running-index labels) and the images
WORKLOADS = ("embed_running", "jpeg")
MATMUL_N = 464
GIL_LOOPS = 40_000
# the busy worker's environment: numpy's BLAS on one thread (threadpoolctl makes sure)
ENV = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# systems run busy: every reader but HF streaming (~1,000 samples/s) and the raw limits
SYSTEMS = ("ours", "webdataset", "mosaic", "litdata", "litdata_bd0")


class Consumer:
    """``kind``'s fixed work, called once per batch."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown busy kind {kind!r}: choose from {', '.join(KINDS)}")
        self.kind = kind
        self.blas_threads = one_blas_thread()
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
        self.b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
        self.out = np.empty_like(self.a)

    def __call__(self) -> None:
        if self.kind == "matmul":
            np.matmul(self.a, self.b, out=self.out)
        else:
            _python_loop(GIL_LOOPS)

    def calibrate(self, calls: int = 20) -> float:
        """The work alone: median milliseconds of ``calls`` calls (after one warm-up)."""
        self()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            self()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)


def _python_loop(n: int) -> int:
    """Pure-Python work that holds the GIL throughout (no call that releases it)."""
    x = 0
    for i in range(n):
        x += i * i & 0xFF
    return x


def one_blas_thread() -> int | None:
    """Limit numpy's BLAS to one thread (threadpoolctl, when installed); the threads BLAS has
    now (None: threadpoolctl missing, the environment of :data:`ENV` alone limits it)."""
    try:
        import threadpoolctl
    except ImportError:
        return None
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")
    infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return max((int(i["num_threads"]) for i in infos), default=None)


class StepClock:
    """Time spent waiting for batches (in ``next``) and in the consumer's work."""

    def __init__(self) -> None:
        self.wait_s = 0.0  # after the first batch
        self.work_s = 0.0
        self.steps = 0

    def waited(self, seconds: float, first: bool) -> None:
        if not first:
            self.wait_s += seconds

    def work(self, consumer: Consumer) -> None:
        t0 = time.perf_counter()
        consumer()
        self.work_s += time.perf_counter() - t0
        self.steps += 1

    def result(self, steady_s: float) -> dict[str, Any]:
        """What the read reports: ``steady_s`` is the time from the first batch to the end."""
        return {
            "wait_share": self.wait_s / steady_s if steady_s > 0 else None,
            "step_work_ms": 1e3 * self.work_s / self.steps if self.steps else None,
        }


# ------------------------------------------------------------------------------------------------
# the orchestrator's side (bench/run.py)
# ------------------------------------------------------------------------------------------------


def label(kind: str, workload: str, system: str, nw: int) -> str:
    return f"busy-{kind} {workload} {system} W{nw}"


def specs(
    kinds: list[str],
    workloads: list[str],
    systems: list[str],
    worker_counts: list[int],
    read_spec: Any,
) -> list[tuple[str, dict[str, Any]]]:
    """The busy runs: each kind x workload x system x num_workers; ``read_spec(workload,
    system, nw)`` gives the plain read's spec (or None when that system does not read it)."""
    out = []
    for kind in kinds:
        for w in workloads:
            for s in (s for s in SYSTEMS if s in systems):
                for nw in worker_counts:
                    spec = read_spec(w, s, nw)
                    if spec is not None:
                        out.append((label(kind, w, s, nw), {**spec, "busy": kind}))
    return out


def targets(agg: dict[str, Any]) -> list[tuple[str, float | None, float]]:
    """(target, ours / best peer, the ratio needed) for each busy kind, workload and
    num_workers ours ran (the other runs of ``agg``, plain reads included, give none)."""
    out = []
    for lbl in sorted(filter(is_busy, agg)):
        kind, w, s, nw = _parse(lbl)
        if s != "ours":
            continue
        ours = agg[lbl].get("samples_per_s")
        peers = [
            agg.get(label(kind, w, p, int(nw[1:])), {}).get("samples_per_s")
            for p in SYSTEMS
            if p != "ours"
        ]
        best = max((p for p in peers if p), default=None)
        ratio = ours / best if ours and best else None
        out.append((f"busy consumer ({kind}), {w}, num_workers={nw[1:]}: ours >= 1.5x the "
                    "best peer", ratio, 1.5))  # fmt: skip
    return out


def _parse(lbl: str) -> tuple[str, str, str, str]:
    head, w, s, nw = lbl.split()
    return head[len("busy-") :], w, s, nw


def is_busy(lbl: str) -> bool:
    return lbl.startswith("busy-")


def markdown(agg: dict[str, Any], titles: dict[str, str], work_titles: dict[str, str]) -> list[str]:
    """The busy-consumer tables (one per kind and workload), ``[]`` when none ran."""
    groups: dict[tuple[str, str], list[tuple[str, str, dict[str, Any]]]] = {}
    for lbl, a in agg.items():
        if is_busy(lbl):
            kind, w, s, nw = _parse(lbl)
            groups.setdefault((kind, w), []).append((s, nw, a))
    lines: list[str] = []
    for (kind, w), rows in sorted(groups.items()):
        ours = {nw: a.get("samples_per_s") for s, nw, a in rows if s == "ours"}
        work = statistics.median([a["work_ms"] for _, _, a in rows if a.get("work_ms")] or [0])
        lines += [
            "",
            f"## Busy consumer ({kind}: {work_titles[kind]}, {work:.1f} ms alone): {w}",
            "",
            "| system | workers | samples/s | ours ÷ this | waiting for data | samples/CPU-s "
            "| peak RSS MB |",
            "|---|---|---|---|---|---|---|",
        ]
        order = {s: i for i, s in enumerate(SYSTEMS)}
        for s, nw, a in sorted(rows, key=lambda r: (order[r[0]], r[1])):
            if not a.get("runs"):
                err = (a.get("errors") or ["?"])[0].splitlines()[0][:120]
                lines.append(f"| {titles.get(s, s)} | {nw[1:]} | failed: {err} |||||")
                continue
            rate = a.get("samples_per_s")
            base = ours.get(nw)
            ratio = "–" if s == "ours" or not (rate and base) else f"{base / rate:.1f}x"
            share = a.get("wait_share")
            lines.append(
                f"| {titles.get(s, s)} | {nw[1:]} | {_n(rate)} | {ratio} "
                f"| {'–' if share is None else f'{100 * share:.0f}%'} "
                f"| {_n(a.get('samples_per_cpu_s'))} | {_n(a.get('peak_rss_mb'))} |"
            )
    return lines


def _n(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


WORK_TITLES = {
    "matmul": f"a {MATMUL_N}x{MATMUL_N} float32 numpy matmul per batch, one BLAS thread",
    "gil": f"a pure-Python loop of {GIL_LOOPS:,} iterations per batch, holding the GIL",
}
