"""A small block of shared memory through which the main process steers its DataLoader workers.

Persistent workers keep the copy of the dataset they were started with, so anything that changes
between epochs (the epoch, a forced curriculum variant, a resume point) travels through a tensor
in shared memory instead of an attribute. Workers read it when an iteration starts; they write
only their own row of counters, of samples skipped in the current pass, and the shard they are
reading (which the main process names when a worker dies). The memory is released with the last reference (no named
segment that could leak after a crash).
"""

from __future__ import annotations

import json
from typing import Any

import torch

# control slots
_EPOCH, _RESUME_LEN, _FORCED = range(3)
_NSLOTS = 3
RESUME_CAPACITY = 1 << 16  # bytes of JSON for a resume chain

# per-worker counters
COUNTERS = (
    "samples",
    "batches",
    "skipped_samples",
    "skipped_batches",
    "gathered_batches",
    "parsed_batches",
    "parsed_samples",
)
_INDEX = {name: i for i, name in enumerate(COUNTERS)}
# per-worker stage clocks and I/O counts (``loader.metrics()``): nanoseconds, bytes, requests
METRICS = ("fetch_ns", "decode_ns", "collate_ns", "bytes_read", "requests", "cache_hits")
_METRIC = {name: i for i, name in enumerate(METRICS)}
# per-worker slots of the current pass, after the counters in the same row
_PASS_SKIPPED, _READING = len(COUNTERS), len(COUNTERS) + 1


class Control:
    """Epoch, forced curriculum variant, resume point and counters shared with the workers."""

    def __init__(self, max_workers: int) -> None:
        self._slots = torch.zeros(_NSLOTS, dtype=torch.int64).share_memory_()
        self._resume = torch.zeros(RESUME_CAPACITY, dtype=torch.uint8).share_memory_()
        # one segment (each holds a descriptor): counters, then the pass slots
        self._counters = torch.zeros(
            (max(max_workers, 1), len(COUNTERS) + 2), dtype=torch.int64
        ).share_memory_()
        self._metrics = torch.zeros(
            (max(max_workers, 1), len(METRICS)), dtype=torch.int64
        ).share_memory_()

    # -- main process ----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._slots[_EPOCH])

    @epoch.setter
    def epoch(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"epoch must be >= 0, got {value}")
        self._slots[_EPOCH] = int(value)

    @property
    def forced(self) -> int | None:
        """The index of the curriculum variant every sample gets, or None (the schedule)."""
        value = int(self._slots[_FORCED])
        return None if value == 0 else value - 1

    @forced.setter
    def forced(self, index: int | None) -> None:
        self._slots[_FORCED] = 0 if index is None else int(index) + 1

    def set_resume(self, resume: dict[str, Any] | None) -> None:
        """Publish a resume point (a JSON-able dict) for the next iteration, or clear it."""
        if resume is None:
            self._slots[_RESUME_LEN] = 0
            return
        data = json.dumps(resume).encode()
        if len(data) > RESUME_CAPACITY:
            raise ValueError(f"resume state too large ({len(data)} bytes)")
        self._resume[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._slots[_RESUME_LEN] = len(data)

    def counters(self) -> dict[str, int]:
        """Counters summed over workers."""
        totals = self._counters[:, : len(COUNTERS)].sum(dim=0).tolist()
        return dict(zip(COUNTERS, totals, strict=True))

    def reading(self, worker: int) -> int | None:
        """The index of the shard ``worker`` last started a batch of, or None."""
        value = int(self._counters[worker, _READING])
        return None if value == 0 else value - 1

    # -- workers -------------------------------------------------------------------------------
    def resume(self) -> dict[str, Any] | None:
        """The published resume point, or None."""
        n = int(self._slots[_RESUME_LEN])
        if not n:
            return None
        return json.loads(bytes(self._resume[:n].numpy()))

    def metrics(self) -> dict[str, int]:
        """The stage clocks and I/O counts (:data:`METRICS`) summed over workers, cumulative."""
        totals = self._metrics.sum(dim=0).tolist()
        return dict(zip(METRICS, totals, strict=True))

    def add_metrics(self, worker: int, values: dict[str, int]) -> None:
        """Add ``values`` (names of :data:`METRICS`) to ``worker``'s row."""
        row = self._metrics.numpy()[worker]
        for name, value in values.items():
            row[_METRIC[name]] += value

    def add(self, worker: int, name: str, value: int = 1) -> None:
        # through a numpy view of the shared memory: a tensor's ``+=`` costs ~50 us a call
        self._counters.numpy()[worker, _INDEX[name]] += value

    def start_pass(self, worker: int) -> None:
        """A new iteration of ``worker`` begins: nothing skipped, no shard read yet."""
        self._counters[worker, _PASS_SKIPPED:] = 0

    def add_skipped(self, worker: int) -> int:
        """Count a sample ``worker`` skipped in this pass; returns the rank's total."""
        counters = self._counters.numpy()
        counters[worker, _PASS_SKIPPED] += 1
        return int(counters[:, _PASS_SKIPPED].sum())

    def set_reading(self, worker: int, shard: int) -> None:
        """Record the shard ``worker`` is now reading (by index in the split)."""
        self._counters.numpy()[worker, _READING] = shard + 1
