"""The batch reader: the byte ranges of planned batches, read coalesced into pooled buffers, one
group of batches ahead of the decoders."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdsloader import plan
from wdsloader.decode.batch import RawBatch
from wdsloader.decode.placement import Placed, Placement
from wdsloader.errors import WdsLoaderError
from wdsloader.format import ShardInfo
from wdsloader.io.buffers import BufferPool
from wdsloader.io.joined import Done, Joined, start_joined
from wdsloader.io.ranges import Cut, Hole, Piece, Request
from wdsloader.io.store import Store
from wdsloader.io.tuning import ahead_budget, node_memory_bytes
from wdsloader.plan.coalesce import Runs, coalesce
from wdsloader.stream.first_read import Prefetch, max_gap, widen
from wdsloader.stream.inflate import Inflater
from wdsloader.stream.read_ahead import ReadAhead, groups

log = logging.getLogger(__name__)

# remotely, a first window of fewer bytes (estimated from the manifest) is read whole: at 1 Gbit/s
# it takes about as long as the first batch's samples one request each (a round trip per 32 of
# them, and CPU per request); a larger one is read after its first batch
FIRST_ALONE_BYTES = 32 << 20
# a local group of batches read together holds at most this (at least one batch): each batch
# in flight holds arrays of its own, and large samples (160 KiB blobs) in groups of a window's
# batches held ~18 arrays, each faulted in anew on an epoch's first pass (~40% of its time)
LOCAL_GROUP_BYTES = 32 << 20


class BatchReader:
    """Reads the samples of planned batches (sample ids of the split) from ``store``.

    The ranges of a group of batches come from the shards' indexes and are coalesced
    (:func:`~wdsloader.plan.coalesce.coalesce`) into one buffer when every read succeeds; with
    ``skip_unreadable`` (``on_error="skip"``) a range that cannot be read leaves its exception
    in place of its bytes, for the decoder to skip its samples.
    """

    def __init__(
        self,
        store: Store,
        shards: Sequence[ShardInfo],
        counts: Sequence[int],
        skip_unreadable: bool,
    ) -> None:
        self.store = store
        self.shards = list(shards)
        self.counts = counts
        self.skip_unreadable = skip_unreadable
        # read buffers, kept from one pass to the next: a new pass reads into memory that is
        # already faulted in (a pass's first groups would otherwise cost a page fault per 4 KiB)
        self.pool = BufferPool()
        # compressed shards: each sample inflated after the read (None: no compressed shard)
        compressed = any(s.compression is not None for s in self.shards)
        self.inflate = Inflater(self.shards, store.url) if compressed else None
        self._placement: Placement | None = None
        samples = sum(s.num_samples for s in self.shards)
        self.sample_bytes = sum(s.num_bytes for s in self.shards) / max(1, samples)
        self.first_alone_bytes = FIRST_ALONE_BYTES

    @property
    def placement(self) -> Placement | None:
        """The long fixed-size fields read straight into batch arrays (set by the dataset when
        its columnar decoder checks and hands them out)."""
        return self._placement

    @placement.setter
    def placement(self, placement: Placement | None) -> None:
        self._placement = placement
        # the read buffers then have holes where the fields' bytes would be: in small pages,
        # the holes take no memory
        self.pool.small_pages = bool(placement)

    def read(
        self,
        batches: Sequence[np.ndarray],
        pool: BufferPool | None = None,
        place: bool = False,
        prefetch: Prefetch | None = None,
    ) -> list[RawBatch]:
        """The :class:`RawBatch` of each of ``batches``, read together (into a buffer of
        ``pool`` when the store reads local files; else a fresh one). With ``place``, the
        fields of :attr:`placement` go straight into batch arrays when the files are local
        (:attr:`RawBatch.placed`: for the columnar decoder only). With ``prefetch``, the
        first read widens its runs over small gaps and leaves their bytes there; the next read
        takes those bytes from it, its runs spanning them (one request on each side of them
        at most, none for bytes read before)."""
        return self.start(batches, pool, place, prefetch).result()

    def start(
        self,
        batches: Sequence[np.ndarray],
        pool: BufferPool | None = None,
        place: bool = False,
        prefetch: Prefetch | None = None,
    ) -> GroupRead:
        """:meth:`read` started: the ranges planned and read, or, from a store that queues
        its requests (:func:`~wdsloader.io.joined.start_joined`), queued behind those of the
        reads started before and not waited for; :meth:`GroupRead.result` is the batches."""
        ids = np.concatenate(batches) if len(batches) > 1 else batches[0]
        shard_idx, local, starts, stops = self._ranges(ids)
        held = prefetch is not None and prefetch.kept
        first = prefetch is not None and prefetch.fresh
        runs = self._runs(shard_idx, starts, stops, prefetch if held else None)
        if first and prefetch is not None:
            prefetch.fresh = False
            runs = self._widen(runs, shard_idx, starts, stops, prefetch)
        requests = [
            (self.shards[s], a, b)
            for s, a, b in zip(
                runs.key.tolist(), runs.start.tolist(), runs.stop.tolist(), strict=True
            )
        ]
        group = GroupRead(self, batches, len(ids), shard_idx, local, starts, stops, runs, requests)
        try:
            if held and prefetch is not None:
                group.joined = prefetch.start_joined(self.store, requests)
            elif not self.store.reads_locally:
                # into a pooled buffer: a new one per group faults in each window's pages anew
                out = pool.lease(int((runs.stop - runs.start).sum())) if pool is not None else None
                group.joined = start_joined(self.store, requests, out)
                if first and prefetch is not None:
                    prefetch.keep(requests, group.joined)
            else:
                out, cuts = None, None
                if pool is not None:
                    out = pool.lease(int((runs.stop - runs.start).sum()))
                # compressed shards hold no field's bytes as they are: nothing is placed
                if place and self.placement and self.inflate is None:
                    cuts = self._place(batches, ids, starts, stops, shard_idx, runs, group.placed)
                group.joined = Done(*self.store.read_joined(requests, out, cuts))
        except (WdsLoaderError, OSError) as exc:
            if not self.skip_unreadable:
                raise
            group.failed = exc
        return group

    def _finish(self, group: GroupRead) -> list[RawBatch]:
        """The batches of a started read (:meth:`GroupRead.result`)."""
        g = group
        runs, batches, placed = g.runs, g.batches, g.placed
        buf: np.ndarray | None = None
        data: list[Any]
        try:
            if g.failed is not None:
                raise g.failed
            assert g.joined is not None  # started, or failed
            joined, run_pos = g.joined.result()
            self._read_bytes(batches, placed, g.shard_idx)
            buf = np.frombuffer(joined, dtype=np.uint8)
            data = [joined] * g.count
            base = (runs.start - np.asarray(run_pos, dtype=np.int64))[runs.run_of]
        except (WdsLoaderError, OSError):
            if not self.skip_unreadable:
                raise
            datas: list[Any] = []
            for req in g.requests:
                try:
                    datas.extend(self.store.read_ranges([req]))
                except (WdsLoaderError, OSError) as exc:
                    log.warning("skipping unreadable range: %s", exc)
                    datas.append(exc)
            data = [datas[r] for r in runs.run_of]
            base = runs.start[runs.run_of]
            placed = [{} for _ in batches]  # each range read whole
        rel_start, rel_stop = g.starts - base, g.stops - base
        raws: list[RawBatch] = []
        pos = 0
        for batch, rows in zip(batches, placed, strict=True):
            sl = slice(pos, pos + len(batch))
            raw = RawBatch(
                buf, data[sl], rel_start[sl], rel_stop[sl], base[sl], g.shard_idx[sl], g.local[sl]
            )
            raw.placed = {k: Placed(v.rows, v.at - base[sl]) for k, v in rows.items()}
            raws.append(raw)
            pos += len(batch)
        if self.inflate is not None:
            raws = [self.inflate(raw) for raw in raws]
        return raws

    def _ranges(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each sample's shard, its index in the shard, and its byte range there."""
        shard_idx, local = plan.shard_of(ids, self.counts)
        starts = np.empty(len(ids), dtype=np.int64)
        stops = np.empty(len(ids), dtype=np.int64)
        used = np.unique(shard_idx)
        self.store.load_indexes([self.shards[s] for s in used.tolist()])
        for s in used:
            mask = shard_idx == s
            offsets = self.store.index(self.shards[s])
            starts[mask] = offsets[local[mask]]
            stops[mask] = offsets[local[mask] + 1]
        return shard_idx, local, starts, stops

    def _widen(
        self,
        runs: Runs,
        shard_idx: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        prefetch: Prefetch,
    ) -> Runs:
        """``runs`` widened over the gaps whose bytes are samples of ``prefetch.window`` (read
        next, so read once), none when it has no samples."""
        if prefetch.window is None or not len(prefetch.window):
            return runs
        w_shard, _, w_starts, w_stops = self._ranges(prefetch.window)
        both = coalesce(np.r_[shard_idx, w_shard], np.r_[starts, w_starts], np.r_[stops, w_stops])
        # the run of both that holds each run: a gap is the window's between runs in one
        outer = np.empty(len(runs.key), dtype=np.int64)
        outer[runs.run_of] = both.run_of[: len(shard_idx)]
        return widen(runs, max_gap(self.store), prefetch.budget, outer[1:] == outer[:-1])

    def _runs(
        self, shard_idx: np.ndarray, starts: np.ndarray, stops: np.ndarray, held: Prefetch | None
    ) -> Runs:
        """The samples' ranges coalesced into runs; with ``held``, the runs of the samples and
        its ranges together, less the runs that hold none of the samples."""
        if held is None:
            return coalesce(shard_idx, starts, stops)
        c_shard, c_starts, c_stops = held.ranges({s.path: i for i, s in enumerate(self.shards)})
        n = len(shard_idx)
        both = coalesce(np.r_[shard_idx, c_shard], np.r_[starts, c_starts], np.r_[stops, c_stops])
        kept = np.unique(both.run_of[:n])
        run_of = np.searchsorted(kept, both.run_of[:n]).astype(np.int64)
        return Runs(both.key[kept], both.start[kept], both.stop[kept], run_of)

    def _place(
        self,
        batches: Sequence[np.ndarray],
        ids: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        shard_idx: np.ndarray,
        runs: Runs,
        placed: list[dict[str, Placed]],
    ) -> list[list[Cut]] | None:
        """The cuts of each run that send the placed fields' bytes to their batch arrays;
        ``placed[b]`` receives batch ``b``'s arrays (their ``at``: shard offsets, for now).
        None when a sample comes twice in the group (its bytes would go to two rows)."""
        assert self.placement is not None
        if len(np.unique(ids)) != len(ids):
            return None
        # the arrays of the group read now, of the group being decoded and of a batch held:
        # kept for reuse as they return (a new array would cost a page fault per 4 KiB)
        pool = self.placement.pool
        pool.keep = max(pool.keep, 2 * len(batches) + 2)
        run_parts: list[np.ndarray] = []
        off_parts: list[np.ndarray] = []
        views: list[Piece] = []
        pos = 0
        for batch, into in zip(batches, placed, strict=True):
            sl = slice(pos, pos + len(batch))
            pos += len(batch)
            plans = self.placement.plan(starts[sl], stops[sl], shard_idx[sl])
            for name, (rows, data) in plans.items():
                into[name] = Placed(rows, data)
                flat = memoryview(rows.reshape(-1))  # type: ignore[arg-type]
                width = rows.shape[1]
                if self.placement.as_bytes(name):  # read into bytes later: a hole, not a row
                    views += [Hole(width)] * len(data)
                else:
                    views += [flat[j * width : (j + 1) * width] for j in range(len(rows))]
                run_parts.append(runs.run_of[sl])
                off_parts.append(data - runs.start[runs.run_of[sl]])
        if not views:
            return None
        run, off = np.concatenate(run_parts), np.concatenate(off_parts)
        cuts: list[list[Cut]] = [[] for _ in range(len(runs.start))]
        order = np.lexsort((off, run))  # by run, then offset: the order of the file's bytes
        for k, r, o in zip(order.tolist(), run[order].tolist(), off[order].tolist(), strict=True):
            cuts[r].append((o, views[k]))
        return cuts

    def _read_bytes(
        self, batches: Sequence[np.ndarray], placed: list[dict[str, Placed]], shard_idx: np.ndarray
    ) -> None:
        """The placed rows of undeclared bytes fields (a hole in the read buffer so far) read
        from the files, each into a ``bytes`` of its own: one copy, on this (the read)
        thread. ``placed[b]``: batch ``b``'s, their ``at`` still shard offsets."""
        if self.placement is None:
            return
        pos = 0
        for batch, into in zip(batches, placed, strict=True):
            shards = shard_idx[pos : pos + len(batch)].tolist()
            pos += len(batch)
            for name, p in list(into.items()):
                if self.placement.as_bytes(name):
                    width = p.rows.shape[1]  # type: ignore[union-attr]
                    at = p.at.tolist()
                    reqs = [(self.shards[s], a, a + width) for s, a in zip(shards, at, strict=True)]
                    into[name] = Placed(self.store.read_ranges(reqs), p.at)

    def read_ahead(self, batches: Sequence[np.ndarray], group: int) -> ReadAhead:
        """The batches' reads, a group of ``group`` batches at a time, one group ahead.

        The first batch is read on its own, so that it waits for its own bytes only, not for
        its window's. Remotely its samples (the window shuffle scatters them over the
        window's spans) are read in few requests, each spanning the small gaps between
        samples of a shard (:func:`~wdsloader.stream.first_read.widen`, all in parallel),
        and the rest of its window comes next (the plan is unchanged: only the order of the
        reads), its spans read whole except the bytes the first read holds (taken from it:
        no byte fetched twice), so that later groups are windows again, read a few requests
        per span; a first window of at most :attr:`first_alone_bytes` is read whole."""
        if self.store.reads_locally:
            cap = int(LOCAL_GROUP_BYTES // max(self.sample_bytes, 1))
            return ReadAhead(self, groups(batches, 1, group, cap_samples=cap))
        first = min(group, len(batches))  # the batches of the first window
        window = first * (len(batches[0]) if first else 0) * self.sample_bytes
        budget = self.readahead_bytes(window)
        if window <= self.first_alone_bytes or group == 1:
            return ReadAhead(self, groups(batches, group, group), budget, pipelined=True)
        prefetch = Prefetch(max_gap(self.store))
        return ReadAhead(
            self, groups(batches, 1, group, group - 1), budget, prefetch, pipelined=True
        )

    def readahead_bytes(self, group_bytes: float = 0) -> int:
        """The read-ahead budget: the store's (its :meth:`~wdsloader.io.fetch.ShardStore.tuning`;
        0, one group ahead, for a store that has none), raised to hold two groups of
        ``group_bytes`` where memory allows unless ``ReadOptions.readahead_bytes`` is set
        (:func:`~wdsloader.io.tuning.ahead_budget`)."""
        tuning = getattr(self.store, "tuning", None)
        if tuning is None:
            return 0
        tuned = int(tuning().readahead_bytes)
        options = getattr(self.store, "options", None)
        if options is not None and options.readahead_bytes is not None:
            return tuned  # set explicitly: it wins
        readers = int(getattr(self.store, "readers", 1))
        return ahead_budget(tuned, group_bytes, readers, node_memory_bytes())


@dataclass(eq=False)
class GroupRead:
    """A group's read started by :meth:`BatchReader.start`: :meth:`result` is its batches
    (waiting for their bytes where they are still on their way)."""

    reader: BatchReader
    batches: Sequence[np.ndarray]
    count: int  # samples
    shard_idx: np.ndarray
    local: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    runs: Runs
    requests: list[Request]
    placed: list[dict[str, Placed]] = field(default_factory=list)
    joined: Joined | None = None
    failed: BaseException | None = None  # the start's error (skip_unreadable: read one by one)

    def __post_init__(self) -> None:
        self.placed = [{} for _ in self.batches]

    def result(self) -> list[RawBatch]:
        """The :class:`RawBatch` of each batch (see :meth:`BatchReader.read`)."""
        return self.reader._finish(self)

    def cancel(self) -> None:
        """Drop the group's requests not sent yet (its read is abandoned)."""
        if self.joined is not None:
            self.joined.cancel()
