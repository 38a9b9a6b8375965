"""Where the machine's CPU went during one remote epoch: the S3 server, the latency proxy (a
thread of the bench process) and the whole machine, read from Linux's /proc.

On a small machine the server and the proxy share the cores with the reader being measured; a
reader that keeps the machine busy has reached what the machine can serve, whatever the link's
ceiling. :class:`CpuWatch` puts numbers on that for each epoch.
"""

from __future__ import annotations

import os
import resource
from typing import Any

__all__ = ["CpuWatch", "process_tree_cpu", "machine_busy"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) "


def process_tree_cpu(pid: int) -> float | None:
    """User + system CPU-seconds of ``pid`` and its live descendants (None off Linux or when
    ``pid`` is gone)."""
    if not os.path.isdir("/proc"):
        return None
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None:
                parents[int(name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        grew = bool(more)
        tree |= more
    total, seen = 0, False
    for p in tree:
        fields = _stat_fields(p)
        if fields is not None:
            seen = True
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK if seen else None


def machine_busy() -> tuple[float, float] | None:
    """(busy, total) CPU-seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


class CpuWatch:
    """CPU-seconds spent by the server process tree, by this process (the proxy thread: the
    bench process otherwise only waits), and the machine's busy share, between :meth:`start`
    and :meth:`stop`."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self._start: tuple[float | None, float, tuple[float, float] | None] | None = None

    @staticmethod
    def _own() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def _now(self) -> tuple[float | None, float, tuple[float, float] | None]:
        server = process_tree_cpu(self.server_pid) if self.server_pid else None
        return server, self._own(), machine_busy()

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, Any]:
        """``server_cpu_s``, ``proxy_cpu_s`` and ``machine_busy_share`` (of all cores) since
        :meth:`start`; a value that cannot be read is None."""
        assert self._start is not None, "start() first"
        (s0, p0, m0), (s1, p1, m1) = self._start, self._now()
        busy = None
        if m0 is not None and m1 is not None and m1[1] > m0[1]:
            busy = (m1[0] - m0[0]) / (m1[1] - m0[1])
        return {
            "server_cpu_s": s1 - s0 if s0 is not None and s1 is not None else None,
            "proxy_cpu_s": p1 - p0,
            "machine_busy_share": busy,
            "cores": os.cpu_count(),
        }
