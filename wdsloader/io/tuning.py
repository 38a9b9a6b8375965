"""Request size, requests in flight and read-ahead of remote reads, from the measured path.

:func:`tune` is pure: given the round-trip time and one connection's throughput (measured on
the first requests by a :class:`Probe`), it returns the :class:`Tuning` a store reads with.
Values set explicitly in :class:`~wdsloader.io.options.ReadOptions` win over the derived ones.

The rules (``rtt``: seconds; ``rate``: bytes/s of one connection):

- **request size**: a request spends ``rtt`` waiting and ``size / rate`` transferring; the
  size where the transfer is 80% of its time, ``4 * rtt * rate``, rounded up to a power of two
  and kept within 8-16 MiB (smaller requests cost the server and the reader a request's CPU
  for fewer bytes, and leave a slow path waiting; larger ones leave fewer requests to share a
  window's spans).
- **concurrency**: enough requests in flight to carry this process's share of
  :data:`TARGET_BYTES_PER_S` (a node's link, 20 Gbit/s, shared by the node's ``readers``:
  its ranks times their DataLoader workers) at that size: ``target / readers * (rtt + size /
  rate) / size``, within 4-64. A fast, near path gets few threads (each costs CPU); a far one
  many; a node of many reading processes few in each.
- **read-ahead**: the bytes of that many requests, at least 32 MiB and at most
  :data:`MAX_READAHEAD_BYTES` (256 MiB): bytes read beyond the group of batches being decoded.
  A reader raises it to hold :data:`AHEAD_GROUPS` groups (shuffle windows) where memory allows
  (:func:`ahead_budget`): the next window's requests then queue behind the current one's, and
  the link is not idle at a window's end. Peak memory of a reading process is bounded by the
  group being decoded plus this budget (plus one group when a group is larger than it).

Before anything is measured (no request answered yet), :data:`UNMEASURED` applies.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

__all__ = [
    "AHEAD_GROUPS",
    "MAX_READAHEAD_BYTES",
    "MEMORY_SHARE",
    "TARGET_BYTES_PER_S",
    "UNMEASURED",
    "Probe",
    "Tuning",
    "ahead_budget",
    "node_memory_bytes",
    "tune",
]

MiB = 2**20
MIN_REQUEST_BYTES = 8 * MiB
MAX_REQUEST_BYTES = 16 * MiB
MIN_CONCURRENCY = 4
MAX_CONCURRENCY = 64
MIN_READAHEAD_BYTES = 32 * MiB
MAX_READAHEAD_BYTES = 256 * MiB
TARGET_BYTES_PER_S = 2.5e9  # 20 Gbit/s: the link a node's reads should be able to fill
TRANSFER_SHARE = 0.8  # of a request's time spent transferring bytes (not waiting a round trip)
# groups (shuffle windows) a remote reader holds read ahead of the one decoded, memory allowing
AHEAD_GROUPS = 2
# the most of a node's memory the read-ahead of all its readers takes together (ahead_budget)
MEMORY_SHARE = 1 / 8
# a request of at most this many bytes measures the round trip; of at least BULK_BYTES, the rate
SMALL_BYTES = 256 * 1024
BULK_BYTES = 512 * 1024


@dataclass(frozen=True, slots=True)
class Tuning:
    """How a store reads: ``request_bytes`` per ranged request at most, ``concurrency``
    requests in flight, ``readahead_bytes`` read ahead of the batches being decoded; the
    measured ``rtt_s`` and per-connection ``bytes_per_s`` it came from (None: not measured)."""

    request_bytes: int
    concurrency: int
    readahead_bytes: int
    rtt_s: float | None = None
    bytes_per_s: float | None = None


UNMEASURED = Tuning(request_bytes=8 * MiB, concurrency=32, readahead_bytes=128 * MiB)


def _clamp(value: float, low: int, high: int) -> int:
    return int(min(high, max(low, value)))


def _usable(rtt_s: float | None, bytes_per_s: float | None) -> bool:
    """Whether a round trip and a rate are measurements the rules can take: finite, the round
    trip >= 0 and the rate > 0."""
    if rtt_s is None or bytes_per_s is None:
        return False
    return math.isfinite(rtt_s) and math.isfinite(bytes_per_s) and rtt_s >= 0 < bytes_per_s


def tune(
    rtt_s: float | None,
    bytes_per_s: float | None,
    *,
    request_bytes: int | None = None,
    concurrency: int | None = None,
    readahead_bytes: int | None = None,
    readers: int = 1,
) -> Tuning:
    """The :class:`Tuning` for a path of round trip ``rtt_s`` and one connection's
    ``bytes_per_s`` (see the module's text); :data:`UNMEASURED` values where either is None.
    ``request_bytes``, ``concurrency`` and ``readahead_bytes`` given (not None) are kept; the
    measurements are returned as given. ``readers``: the node's reading processes that share
    its link (and memory): the concurrency and read-ahead of each are its share."""
    if not _usable(rtt_s, bytes_per_s):  # unmeasured, or not a measurement (NaN, inf, <= 0)
        base = UNMEASURED
        size, inflight, ahead = base.request_bytes, base.concurrency, base.readahead_bytes
    else:
        assert rtt_s is not None and bytes_per_s is not None
        rtt = max(rtt_s, 1e-5)
        wanted = min(TRANSFER_SHARE / (1 - TRANSFER_SHARE) * rtt * bytes_per_s, MAX_REQUEST_BYTES)
        size = _clamp(
            2 ** math.ceil(math.log2(max(wanted, 1))), MIN_REQUEST_BYTES, MAX_REQUEST_BYTES
        )
        if request_bytes is not None:
            size = request_bytes
        seconds = rtt + size / bytes_per_s  # one request's time
        target = TARGET_BYTES_PER_S / max(1, readers)
        needed = min(target * seconds / size, MAX_CONCURRENCY)
        inflight = _clamp(math.ceil(needed), MIN_CONCURRENCY, MAX_CONCURRENCY)
        if concurrency is not None:
            inflight = concurrency
        ahead = _clamp(inflight * size, MIN_READAHEAD_BYTES, MAX_READAHEAD_BYTES)
    return Tuning(
        request_bytes=request_bytes if request_bytes is not None else size,
        concurrency=concurrency if concurrency is not None else inflight,
        readahead_bytes=readahead_bytes if readahead_bytes is not None else ahead,
        rtt_s=rtt_s,
        bytes_per_s=bytes_per_s,
    )


def ahead_budget(
    tuned: int, group_bytes: float, readers: int = 1, memory_bytes: int | None = None
) -> int:
    """A remote reader's read-ahead: the ``tuned`` budget (:func:`tune`), raised to hold
    :data:`AHEAD_GROUPS` groups of ``group_bytes`` where memory allows: at most
    :data:`MAX_READAHEAD_BYTES`, and the node's ``readers`` together at most
    :data:`MEMORY_SHARE` of its ``memory_bytes`` (None: not known, the first bound only).
    With two groups ahead, the next group's requests are queued while the current one's last
    answers arrive."""
    cap = MAX_READAHEAD_BYTES
    if memory_bytes is not None and memory_bytes > 0:
        cap = min(cap, int(memory_bytes * MEMORY_SHARE / max(1, readers)))
    return max(int(tuned), min(math.ceil(AHEAD_GROUPS * group_bytes), cap))


def node_memory_bytes() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


class Probe:
    """The round trip and one connection's throughput, from the requests a store made.

    :meth:`add` takes each answered request's bytes and seconds (from sending it to its last
    byte). The round trip is the fastest request of at most 256 KiB (an index, a sample);
    the rate is the best ``bytes / (seconds - rtt)`` of requests of at least 512 KiB. Both
    are None until such requests were seen (or given: measured by another process).
    Thread-safe.
    """

    def __init__(self, rtt_s: float | None = None, bytes_per_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self.rtt_s = rtt_s
        self.bytes_per_s = bytes_per_s
        self._bulk: list[tuple[int, float]] = []

    def add(self, nbytes: int, seconds: float) -> None:
        """Record one answered request of ``nbytes`` that took ``seconds``."""
        if not (math.isfinite(seconds) and seconds > 0):
            return  # no time measured (a coarse clock): neither a round trip nor a rate
        with self._lock:
            if nbytes <= SMALL_BYTES and (self.rtt_s is None or seconds < self.rtt_s):
                self.rtt_s = seconds
            if nbytes >= BULK_BYTES:
                self._bulk.append((nbytes, seconds))
                self._bulk = self._bulk[-64:]
            if self._bulk:
                rtt = self.rtt_s if self.rtt_s is not None else 0.0
                rates = [n / max(s - rtt, s / 10) for n, s in self._bulk]
                self.bytes_per_s = max(rates)

    @property
    def measured(self) -> bool:
        """Whether both the round trip and the rate are known."""
        return self.rtt_s is not None and self.bytes_per_s is not None
