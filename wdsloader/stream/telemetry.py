"""Where a loader's time goes, per epoch and rank: how long the training loop waited for each
batch (measured in the main process around ``next``), and the seconds the workers spent in each
stage (fetching bytes, decoding, collating), with bytes read, requests and cache hits.

Workers add their stage clocks to shared counters (:class:`StageClock`); the main process keeps
what they read at the epoch's start and reports the difference (:class:`Telemetry`). Hooks
receive the metrics every ``every`` batches: built-in reporters write them to a TensorBoard
``SummaryWriter`` or the ``logging`` module; any callable will do (e.g. ``wandb.log``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wdsloader.stream.control import METRICS, Control

log = logging.getLogger(__name__)

Hook = Callable[[dict[str, float], int], Any]
"""A metrics hook: called with the metrics and the number of batches yielded so far."""


class StageClock:
    """A worker's stage timings and I/O counts, added to its row of the control block."""

    __slots__ = ("_io", "_stats")
    IO = ("bytes_read", "requests", "cache_hits")

    def __init__(self, stats: Mapping[str, int]) -> None:
        """``stats``: the store's cumulative counts when the worker's pass begins."""
        self._stats = stats
        self._io = {k: int(stats.get(k, 0)) for k in self.IO}

    @staticmethod
    def now() -> int:
        return time.perf_counter_ns()

    def io(self, control: Control, worker: int, stats: Mapping[str, int]) -> None:
        """Add what the store read since the last call (its cumulative ``stats``). A store
        starts new counters in a new process (a forked worker's first read): then everything
        they hold is this pass's, not the difference with the parent's counts."""
        if stats is not self._stats:
            self._stats, self._io = stats, dict.fromkeys(self.IO, 0)
        now = {k: int(stats.get(k, 0)) for k in self.IO}
        control.add_metrics(worker, {k: now[k] - self._io[k] for k in self.IO})
        self._io = now


@dataclass
class Telemetry:
    """The main process's side: the consumer's wait, the epoch's baseline, the hooks."""

    wait_ns: int = 0
    batches: int = 0
    epoch: int = 0
    base: dict[str, int] = field(default_factory=dict)
    hooks: list[tuple[Hook, int]] = field(default_factory=list)
    # the dataset's counters (with a mix also ``samples/<name>``); None: the control block's
    counters: Callable[[], Mapping[str, int]] | None = None

    def _now(self, control: Control) -> dict[str, int]:
        counters = control.counters() if self.counters is None else self.counters()
        return {**control.metrics(), **counters}

    def start(self, epoch: int, control: Control) -> None:
        """An epoch's iteration begins: the metrics count from here."""
        self.epoch, self.wait_ns, self.batches = epoch, 0, 0
        self.base = self._now(control)

    def waited(self, ns: int) -> None:
        self.wait_ns += ns
        self.batches += 1

    def metrics(self, control: Control) -> dict[str, float]:
        """This rank's metrics of the current (or last) epoch's iteration; reading a mix, also
        ``samples/<name>``: each source's samples."""
        now = self._now(control)
        d = {k: now[k] - self.base.get(k, 0) for k in now}
        per_source = {k: float(v) for k, v in d.items() if k.startswith("samples/")}
        return {
            "epoch": float(self.epoch),
            "wait_s": self.wait_ns / 1e9,
            "fetch_s": d["fetch_ns"] / 1e9,
            "decode_s": d["decode_ns"] / 1e9,
            "collate_s": d["collate_ns"] / 1e9,
            "bytes_read": float(d["bytes_read"]),
            "requests": float(d["requests"]),
            "cache_hits": float(d["cache_hits"]),
            "samples": float(d["samples"]),
            "batches": float(self.batches),
            **per_source,
        }

    def after_batch(self, control: Control) -> None:
        """Call the hooks whose period ends at this batch."""
        for hook, every in self.hooks:
            if self.batches % every == 0:
                hook(self.metrics(control), self.batches)


def all_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` over the process group: the mean of each, and ``max_wait_s``, the slowest
    rank's wait (every rank must call it: a collective)."""
    import torch
    import torch.distributed as dist

    names = sorted(metrics)
    values = torch.tensor([metrics[k] for k in names], dtype=torch.float64)
    wait = torch.tensor([metrics["wait_s"]], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    dist.all_reduce(wait, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    out = {k: float(v) / world for k, v in zip(names, values.tolist(), strict=True)}
    out["max_wait_s"] = float(wait[0])
    return out


class TensorBoardReporter:
    """A hook writing each metric as a scalar ``{prefix}/{name}`` at the loader's batch count
    (pass a ``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, writer: Any, prefix: str = "data") -> None:
        self.writer, self.prefix = writer, prefix

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"{self.prefix}/{name}", value, step)


class LoggingReporter:
    """A hook writing one line of metrics to ``logger`` (default: this module's) at INFO."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or log

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        shown = " ".join(f"{k}={v:.3g}" for k, v in metrics.items())
        self.logger.info("data loader after %d batches: %s", step, shown)


__all__ = ["METRICS", "LoggingReporter", "StageClock", "Telemetry", "TensorBoardReporter"]
