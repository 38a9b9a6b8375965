"""The first batch of a remote pass in few requests: its samples' ranges widened over the small
gaps between them (:func:`widen`), and the bytes so read kept for the rest of its window
(:class:`Prefetch`), so that no byte is fetched twice."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wdsloader.format import ShardInfo
from wdsloader.io.joined import Done, Joined, start_joined
from wdsloader.io.store import Store
from wdsloader.plan.coalesce import Runs

# the first batch's read takes at most this many bytes of gaps between its samples (bytes of
# its window's next batches, read early rather than twice; the rule of FIRST_ALONE_BYTES: at
# 1 Gbit/s about as long as a request per sample, whose CPU and round trips cost more; at 40 ms
# RTT this took the bench's first batch from 2.1 s (16 MiB) to 1.55 s)
FIRST_GAP_BYTES = 32 << 20
# a gap merged into a run is at most this long where the path is not measured yet (measured:
# the bytes a connection receives in one round trip, at least this)
FIRST_MAX_GAP = 1 << 20
# the reads after the first that take its bytes (see Prefetch.window)
SERVES = 2


def max_gap(store: Store) -> int:
    """The longest gap the first read spans: the bytes of one round trip of a connection where
    the store's path is measured (at least :data:`FIRST_MAX_GAP`), else that."""
    tuning = getattr(store, "tuning", None)
    t = tuning() if tuning is not None else None
    if t is None or t.rtt_s is None or t.bytes_per_s is None:
        return FIRST_MAX_GAP
    return max(FIRST_MAX_GAP, int(t.rtt_s * t.bytes_per_s))


def widen(runs: Runs, max_gap: int, budget: int, allowed: np.ndarray | None = None) -> Runs:
    """``runs`` with the gaps between runs of the same key merged, the smallest first, while a
    gap is at most ``max_gap`` bytes and the merged gaps take at most ``budget`` bytes in all
    (each input range still in its run: ``run_of`` follows); with ``allowed``, only the gaps
    ``i`` (between runs ``i`` and ``i + 1``) where it is True."""
    n = len(runs.key)
    if n < 2:
        return runs
    gaps = runs.start[1:] - runs.stop[:-1]
    same = runs.key[1:] == runs.key[:-1]
    if allowed is not None:
        same &= allowed
    candidates = np.flatnonzero(same & (gaps <= max_gap))
    order = candidates[np.argsort(gaps[candidates], kind="stable")]
    taken = order[: int(np.searchsorted(np.cumsum(gaps[order]), budget, side="right"))]
    if not len(taken):
        return runs
    joined = np.zeros(n - 1, dtype=bool)
    joined[taken] = True  # run i + 1 joins run i
    new = np.r_[True, ~joined]
    group = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    lasts = np.r_[firsts[1:] - 1, n - 1]
    return Runs(runs.key[firsts], runs.start[firsts], runs.stop[lasts], group[runs.run_of])


class Prefetch:
    """The ranges the first group of a pass reads (with their read) and how it widens its runs;
    the next groups' reads take those bytes from here, not from storage again. Its reads are
    started by one read thread, the first group's before the others'."""

    def __init__(self, max_gap: int, budget: int = FIRST_GAP_BYTES) -> None:
        self.max_gap = max_gap
        self.budget = budget
        self._reqs: list[tuple[ShardInfo, int, int]] = []
        self._read: Joined | None = None
        self._pos: list[int] = []
        self.kept = False
        self.fresh = True  # the first read not started yet
        # the samples of the next reads (the rest of the window and the group after it, which
        # holds the window's last samples when it is not whole batches): the gaps spanned are
        # theirs, and those reads take the held bytes (:data:`SERVES`), then they are dropped
        self.window: np.ndarray | None = None
        self._served = 0

    def keep(self, reqs: Sequence[tuple[ShardInfo, int, int]], read: Joined) -> None:
        """Hold the first group's ranges ``reqs`` and their joined read (under way or over:
        the ranges back to back, each where the sizes before it put it)."""
        self._reqs, self._read, self.kept = list(reqs), read, True
        self._pos = np.cumsum([0] + [b - a for _, a, b in self._reqs[:-1]]).tolist()

    def ranges(self, shard_of: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held ranges as (shard index, start, stop) arrays (``shard_of``: index by path)."""
        r = self._reqs
        return (
            np.array([shard_of[s.path] for s, _, _ in r], dtype=np.int64),
            np.array([a for _, a, _ in r], dtype=np.int64),
            np.array([b for _, _, b in r], dtype=np.int64),
        )

    def start_joined(self, store: Store, reqs: Sequence[tuple[ShardInfo, int, int]]) -> Joined:
        """:meth:`Store.read_joined` of ``reqs`` started (:func:`~wdsloader.io.joined.start_joined`):
        only the bytes not held here requested, the held ones copied in once the first read
        is over; the held bytes are dropped after the :data:`SERVES`-th such read."""
        held: dict[str, list[tuple[int, int, int]]] = {}
        for (shard, a, b), p in zip(self._reqs, self._pos, strict=True):
            held.setdefault(shard.path, []).append((a, b, p))
        fetch: list[tuple[ShardInfo, int, int]] = []
        plan: list[tuple[int, int, int]] = []  # (out position, length, -1 - fetch id | held pos)
        positions, total = [], 0
        for shard, a, b in reqs:
            positions.append(total)
            at = a
            for ha, hb, hp in sorted(held.get(shard.path, [])):
                lo, hi = max(ha, at), min(hb, b)
                if lo >= hi:
                    continue
                if lo > at:
                    plan.append((total + at - a, lo - at, -1 - len(fetch)))
                    fetch.append((shard, at, lo))
                plan.append((total + lo - a, hi - lo, hp + lo - ha))
                at = hi
            if at < b:
                plan.append((total + at - a, b - at, -1 - len(fetch)))
                fetch.append((shard, at, b))
            total += b - a
        first = self._read
        self._served += 1
        if self._served >= SERVES:
            self._reqs, self._pos, self.kept, self._read = [], [], False, None
        if first is None or all(src < 0 for _, _, src in plan):  # nothing held: read as asked
            return start_joined(store, reqs)
        got = start_joined(store, fetch) if fetch else Done(b"", [])
        return _Combined(first, got, plan, positions, total)


class _Combined:
    """A read of ranges partly held by the first read (:meth:`Prefetch.start_joined`): the
    requested bytes and the held ones copied into one buffer when the result is asked for."""

    def __init__(
        self,
        held: Joined,
        got: Joined,
        plan: list[tuple[int, int, int]],
        positions: list[int],
        total: int,
    ) -> None:
        self.held, self.got = held, got
        self.plan, self.positions, self.total = plan, positions, total

    def result(self) -> tuple[bytes | np.ndarray, list[int]]:
        """The buffer (held bytes and fetched ones) and where each range starts."""
        got, got_pos = self.got.result()
        fetched = np.frombuffer(got, dtype=np.uint8)
        data = np.frombuffer(self.held.result()[0], dtype=np.uint8)
        out = np.empty(self.total, dtype=np.uint8)
        for at, n, src in self.plan:
            if src < 0:
                p = got_pos[-1 - src]
                out[at : at + n] = fetched[p : p + n]
            else:
                out[at : at + n] = data[src : src + n]
        return out, self.positions

    def cancel(self) -> None:
        """Drop the requests of its own bytes not sent yet."""
        self.got.cancel()
