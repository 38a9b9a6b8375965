"""The per-worker executor: turns the plan's sample ids into decoded, collated batches."""

from __future__ import annotations

import dataclasses
import logging
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsloader import plan
from wdsloader.decode.codecs import SampleDecoder, parse_sample
from wdsloader.decode.gather import (
    FieldTable,
    field_tables,
    gather_rows,
    key_ends,
    key_strings,
    named_members,
    prefix_end,
    resolve_shape,
    walk_members,
)
from wdsloader.errors import ShardFormatError, SkipLimitError, WdsLoaderError
from wdsloader.format import FieldSpec, Manifest, ShardInfo
from wdsloader.format.ustar import BLOCK, NAME, checksum_ok, checksums_ok
from wdsloader.io.fetch import ShardStore
from wdsloader.plan.coalesce import coalesce
from wdsloader.stream.control import Control
from wdsloader.stream.state import resume_from_dict, resume_to_dict, shards_digest

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")
SMALL_BLOCK = 16 * 2**10  # sample prefixes up to this size are gathered in one piece


@dataclass(slots=True)
class _RawBatch:
    """The read bytes of one batch: sample ``j`` is ``data[j][start[j]:stop[j]]`` of shard
    ``shard[j]`` (its ``local[j]``-th sample); ``base[j]`` turns a position in ``data[j]`` into a
    byte offset in the shard. ``buf`` is the one buffer all samples lie in (None when a read
    failed and ``data`` holds exceptions)."""

    buf: np.ndarray | None
    data: list[Any]
    start: np.ndarray
    stop: np.ndarray
    base: np.ndarray
    shard: np.ndarray
    local: np.ndarray
    owner: np.ndarray | None = None  # the array ``buf`` was read into, when it can be reused


@dataclass(slots=True, frozen=True)
class _Heads:
    """What the first headers of a batch tell the member checks of :meth:`_gather`: their name
    fields and where each key ends; and the data positions of the members the batch's walk
    over its headers found (named and checksummed already), by extension."""

    names: np.ndarray
    ends: np.ndarray
    walked: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


class _Fallback(Exception):
    """The whole-batch path cannot handle this batch; parse it sample by sample."""


@dataclass(slots=True)
class _Refill:
    """The samples that stand in for batches whose every sample failed: found by searching
    the worker's batches after ``searched_from`` (wrapping round) up to ``found``; every batch
    in between failed too, so the same samples serve all of them."""

    searched_from: int = -1
    found: int = -1
    samples: list[dict[str, Any]] | None = None

    def covers(self, index: int) -> bool:
        a, f = self.searched_from, self.found
        if self.samples is None:
            return False
        return a < index < f if a < f else (index > a or index < f)


class _StoreCloser:
    """Close a store's files when the last read of an iteration is over (a Future callback);
    nothing at interpreter exit, when the process's files go anyway."""

    def __init__(self, store: ShardStore) -> None:
        self.store = store
        self.finalizing = sys.is_finalizing

    def __call__(self, _future: Future | None = None) -> None:
        if not self.finalizing():
            self.store.close()


def _close_store(store: ShardStore) -> None:
    """Close a store whose dataset was collected (a weakref.finalize callback)."""
    _StoreCloser(store)()


class ShardStreamDataset(IterableDataset):
    """An IterableDataset that yields whole batches of one split, planned by :mod:`wdsloader.plan.sample_plan`.

    Each DataLoader worker computes its own list of batches from the plan (no coordination),
    reads the byte ranges those samples occupy (coalesced, one group of batches ahead), gathers
    fixed-size fields for the whole batch from the shard layout (falling back to parsing each
    sample), decodes only the requested fields, applies the curriculum and collates inside the
    worker. ``len()`` is the number of batches this rank yields in a full epoch, also with
    ``on_error="skip"`` (see :meth:`_refill`); more than ``max_skipped`` skipped samples in one
    pass of a rank (None: no limit) raise :class:`~wdsloader.errors.SkipLimitError`.
    """

    def __init__(
        self,
        *,
        manifest: Manifest,
        split: str,
        store: ShardStore,
        config: plan.PlanConfig,
        rank: int,
        decoder: SampleDecoder,
        collate_fn: Callable[[list[dict[str, Any]]], Any],
        on_error: str = "raise",
        readahead_batches: int = 1,
        curriculum: Curriculum | None = None,
        gather: bool = True,
        max_skipped: int | None = None,
    ) -> None:
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if max_skipped is not None and (isinstance(max_skipped, bool) or max_skipped < 0):
            raise ValueError(f"max_skipped must be None or >= 0, got {max_skipped!r}")
        if not 0 <= rank < config.world_size:
            raise ValueError(f"rank {rank} outside [0, {config.world_size})")
        self.manifest = manifest
        self.split = split
        self.shards: list[ShardInfo] = list(manifest.split(split).shards)
        self.shards_digest = shards_digest(self.shards)
        self.store = store
        # a loader that is collected without finishing an iteration closes its files too
        weakref.finalize(self, _close_store, store).atexit = False
        self.config = config
        self.rank = rank
        self.decoder = decoder
        self.collate_fn = collate_fn
        self.on_error = on_error
        self.max_skipped = max_skipped
        self._last_skip = ""  # the last error skipped in this process
        self.readahead_batches = max(1, readahead_batches)
        self.curriculum = curriculum
        self.control = Control(config.num_workers)
        schema = manifest.schema
        if decoder.fields is not None:
            self.fields: tuple[str, ...] | None = decoder.fields
        elif decoder.schema is not None:
            self.fields = tuple(decoder.schema)
        else:
            self.fields = None  # schema-less: whatever the samples hold
        self._zero: np.ndarray | None = None
        self._curriculum_specs: dict[str, FieldSpec] = {}
        if curriculum is not None:
            if not schema or self.fields is None:
                raise ValueError("a curriculum needs a dataset schema (the manifest has none)")
            clash = [f for f in curriculum.fields if f in self.fields]
            if clash:
                raise ValueError(
                    f"fields {clash} are variants of the curriculum output "
                    f"{curriculum.output!r}; request {curriculum.output!r} instead"
                )
            self._curriculum_specs = curriculum.output_specs(schema, manifest.dims)
            spec = self._curriculum_specs[curriculum.output]
            shape = resolve_shape(spec.shape or [], manifest.dims)
            if shape is None:
                raise ValueError(
                    f"curriculum output {curriculum.output!r}: shape {spec.shape} has a dim "
                    f"not bound in the manifest's dims {manifest.dims}"
                )
            self._zero = np.zeros(shape, dtype=np.dtype(spec.dtype))
        self._tables = {}
        if gather and schema and self.fields is not None:
            wanted = [*self.fields, *(curriculum.fields if curriculum else ())]
            self._tables = field_tables(schema, wanted, manifest.dims, self.shards)
        # per shard: where parsing starts for the fields that are not gathered
        others = [schema[f].ext.lower() for f in (self.fields or ()) if f not in self._tables]
        self._parse_from = np.array(
            [
                0 if any(e in (s.layout or {}) for e in others) else prefix_end(s.layout)
                for s in self.shards
            ],
            dtype=np.int64,
        )
        self._others = [f for f in (self.fields or ()) if f not in self._tables]
        self._layout_id, self._block_len = self._block_plan(curriculum)

    def _block_plan(self, curriculum: Curriculum | None) -> tuple[np.ndarray, int]:
        """Per shard an id of its layout (-1: none), and the bytes of each sample to gather in
        one piece (0: gather field by field). Worth it when those bytes are few
        (``SMALL_BLOCK``) or the requested fields (and the first variable header) fill at least
        half of them."""
        ids = np.full(len(self.shards), -1, dtype=np.int64)
        if not self._tables:
            return ids, 0
        seen: dict[tuple[Any, ...], int] = {}
        for s in range(len(self.shards)):
            sig = tuple(int(t.offsets[s]) for t in self._tables.values())
            if min(sig) >= 0:
                ids[s] = seen.setdefault((*sig, int(self._parse_from[s])), len(seen))
        if len(seen) != 1:
            return ids, 0
        s0 = int(np.flatnonzero(ids >= 0)[0])
        needed = BLOCK  # the first header: keys
        length = BLOCK
        for table in self._tables.values():
            end = int(table.offsets[s0]) + table.nbytes
            length = max(length, end)
            needed += table.nbytes
        if self._others:
            end = int(self._parse_from[s0]) + BLOCK
            length = max(length, end)
            needed += BLOCK
        # one gather beats several when the rows are short or mostly wanted
        return ids, (length if length <= SMALL_BLOCK or 2 * needed >= length else 0)

    # -- epoch / resume / curriculum -----------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays (also inside persistent workers)."""
        self.control.epoch = epoch

    def force_steering(self, variant: str | None) -> None:
        """Give every sample the curriculum variant ``variant`` (e.g. for validation); None
        restores the schedule. Reaches persistent workers."""
        if self.curriculum is None:
            raise ValueError("this loader has no curriculum (pass curriculum= to create_loader)")
        self.control.forced = None if variant is None else self.curriculum.index(variant)

    @property
    def forced_steering(self) -> str | None:
        """The variant forced by :meth:`force_steering`, or None."""
        index = self.control.forced
        return None if index is None or self.curriculum is None else self.curriculum.names[index]

    def output_schema(self) -> dict[str, FieldSpec]:
        """The :class:`FieldSpec` of every field a batch holds (before collation)."""
        schema = self.manifest.schema
        out = {f: schema[f] for f in (self.fields or ()) if f in schema}
        out.update(self._curriculum_specs)
        return out

    def __len__(self) -> int:
        return plan.num_batches(self.config)

    def resume_point(self) -> plan.Resume | None:
        """The resume point the next iteration starts from, if any."""
        data = self.control.resume()
        return None if data is None else resume_from_dict(data, self.config)

    def set_resume(self, resume: plan.Resume | None) -> None:
        """Make the next iteration continue after ``resume`` (None: from the epoch's start)."""
        self.control.set_resume(None if resume is None else resume_to_dict(resume))

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None and info.num_workers != self.config.num_workers:
            raise RuntimeError(
                f"the DataLoader has {info.num_workers} workers but the plan was made for "
                f"{self.config.num_workers}; build loaders with create_loader"
            )
        batches = plan.worker_batches(
            self.config, self.control.epoch, self.rank, worker, self.resume_point()
        )
        yield from self._iter_batches(batches, worker)

    def peek_batch(self) -> Any:
        """The first batch the next iteration yields, made in this process; what the loader
        yields afterwards, its counters and its state do not change."""
        epoch, resume = self.control.epoch, self.resume_point()
        for worker in range(self.config.num_workers):
            batches = plan.worker_batches(self.config, epoch, self.rank, worker, resume)
            if batches:
                (raw,) = self._read_group(batches[:1])
                return self._make_batch(raw, worker, epoch, self.control.forced, count=False)
        raise ValueError(f"split {self.split!r} yields no batch on rank {self.rank}")

    def _iter_batches(self, batches: Sequence[np.ndarray], worker: int) -> Iterator[Any]:
        self.control.start_pass(worker)
        if not batches:
            return
        epoch, forced = self.control.epoch, self.control.forced
        refill = _Refill()
        closer = _StoreCloser(self.store)  # bound now: the finally may run at interpreter exit
        # locally the first batch is read on its own so it arrives quickly, then a window at a
        # time; remotely its samples would each be a request (the window shuffle scatters them
        # over the window's spans), so the first window is read whole, a few requests per span
        group = self.readahead_batches
        head = 1 if self.store.reads_locally else group
        groups = [batches[:head]] + [
            batches[i : i + group] for i in range(head, len(batches), group)
        ]
        spare: list[np.ndarray] = []  # read buffers nothing refers to any more, for reuse
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdsloader-read")
        pending: Future = pool.submit(self._read_group, groups[0])
        try:
            index = 0  # of the batch in ``batches``
            for g in range(len(groups)):
                raw_batches = pending.result()
                if g + 1 < len(groups):
                    out = spare.pop() if spare else None
                    pending = pool.submit(self._read_group, groups[g + 1], out)
                owner = raw_batches[0].owner if raw_batches else None
                raw = batch = None
                for raw in raw_batches:
                    batch = self._make_batch(raw, worker, epoch, forced)
                    if batch is None:  # every sample failed: never yield fewer batches
                        batch = self._refill(refill, batches, index, worker, epoch, forced)
                    index += 1
                    yield batch
                    del batch
                del raw_batches, raw
                # reuse the buffer unless a decoded value still refers to it (a custom decoder
                # may return views): the only references left are ``owner`` and the argument
                if owner is not None and sys.getrefcount(owner) == 2:
                    spare.append(owner)
                owner = None
        finally:
            # an iteration abandoned early does not wait for the read ahead of it; the store's
            # files are closed once that read is over (cancelled or done). No cancel_futures:
            # at interpreter exit its ``queue.Empty`` lookup fails on a torn-down module.
            pending.cancel()
            pool.shutdown(wait=False)
            pending.add_done_callback(closer)

    def _refill(
        self,
        refill: _Refill,
        batches: Sequence[np.ndarray],
        index: int,
        worker: int,
        epoch: int,
        forced: int | None,
    ) -> Any:
        """The batch that stands in for batch ``index`` when every one of its samples failed
        (on_error=skip): the samples that decode of the next batch of this worker that has
        any (wrapping round to the worker's first batches). Those samples come twice this
        epoch; the rank still yields ``len(loader)`` batches, so resume and DDP stay exact."""
        self.control.add(worker, "skipped_batches")
        if not refill.covers(index):
            refill.searched_from, refill.samples = index, None
            for step in range(1, len(batches)):
                j = (index + step) % len(batches)
                (raw,) = self._read_group([batches[j]])
                samples = self._decode_samples(raw, worker, epoch, forced, count=False)
                if samples:
                    refill.found, refill.samples = j, samples
                    break
            else:
                raise SkipLimitError(
                    f"on_error='skip': no sample of the {len(batches)} batches of worker "
                    f"{worker} on rank {self.rank} could be decoded "
                    f"(split {self.split!r}); last error: {self._last_skip}"
                )
        log.warning(
            "every sample of batch %d of worker %d failed: yielding the %d samples of its "
            "batch %d in its place",
            index,
            worker,
            len(refill.samples or ()),
            refill.found,
        )
        return self.collate_fn(refill.samples)

    # -- reading -------------------------------------------------------------------------------
    def _read_group(
        self, batches: Sequence[np.ndarray], out: np.ndarray | None = None
    ) -> list[_RawBatch]:
        """Read the samples of a group of batches (coalesced ranges, one buffer when all reads
        succeed, reusing ``out`` when it is large enough; with on_error=skip a failed range
        leaves its exception in place of bytes)."""
        ids = np.concatenate(batches) if len(batches) > 1 else batches[0]
        shard_idx, local = plan.shard_of(ids, self.config.counts)
        starts = np.empty(len(ids), dtype=np.int64)
        stops = np.empty(len(ids), dtype=np.int64)
        for s in np.unique(shard_idx):
            mask = shard_idx == s
            offsets = self.store.index(self.shards[s])
            starts[mask] = offsets[local[mask]]
            stops[mask] = offsets[local[mask] + 1]
        runs = coalesce(shard_idx, starts, stops)
        run_of, run_start = runs.run_of, runs.start
        requests = [
            (self.shards[s], a, b)
            for s, a, b in zip(
                runs.key.tolist(), run_start.tolist(), runs.stop.tolist(), strict=True
            )
        ]
        buf: np.ndarray | None = None
        owner: np.ndarray | None = None
        try:
            joined, run_pos = self.store.read_joined(requests, out)
            buf = np.frombuffer(joined, dtype=np.uint8)
            if isinstance(joined, np.ndarray):
                owner = out if out is not None and joined.base is out else joined
            data: list[Any] = [joined] * len(ids)
            base = (run_start - np.asarray(run_pos, dtype=np.int64))[run_of]
        except (WdsLoaderError, OSError):
            if self.on_error == "raise":
                raise
            datas: list[Any] = []
            for req in requests:
                try:
                    datas.extend(self.store.read_ranges([req]))
                except (WdsLoaderError, OSError) as exc:
                    log.warning("skipping unreadable range: %s", exc)
                    datas.append(exc)
            data = [datas[r] for r in run_of]
            base = run_start[run_of]
        rel_start, rel_stop = starts - base, stops - base
        out: list[_RawBatch] = []
        pos = 0
        for batch in batches:
            sl = slice(pos, pos + len(batch))
            out.append(
                _RawBatch(
                    buf,
                    data[sl],
                    rel_start[sl],
                    rel_stop[sl],
                    base[sl],
                    shard_idx[sl],
                    local[sl],
                    owner,
                )
            )
            pos += len(batch)
        return out

    # -- decoding ------------------------------------------------------------------------------
    def _make_batch(
        self, raw: _RawBatch, worker: int, epoch: int, forced: int | None, count: bool = True
    ) -> Any:
        """Decode and collate one batch (None when every sample was skipped)."""
        if count:
            self.control.set_reading(worker, int(raw.shard[0]))
        columns = None
        if self._tables and raw.buf is not None:
            try:
                columns = self._gather_columns(raw, epoch, forced)
            except _Fallback:
                columns = None
        if columns is not None:
            n = len(raw.start)
            if count:
                self.control.add(worker, "samples", n)
                self.control.add(worker, "batches")
                self.control.add(worker, "gathered_batches")
            return _collate_columns(self.collate_fn, columns, n)
        samples = self._decode_samples(raw, worker, epoch, forced, count)
        if count:
            self.control.add(worker, "samples", len(samples))
            self.control.add(worker, "batches")
        return self.collate_fn(samples) if samples else None

    def _variants(self, keys: Sequence[str], epoch: int, forced: int | None) -> np.ndarray:
        assert self.curriculum is not None
        if forced is not None:
            return np.full(len(keys), forced, dtype=np.int64)
        seed = self.curriculum.seed if self.curriculum.seed is not None else self.config.seed
        return self.curriculum.draw(keys, epoch, seed)

    def _gather_columns(
        self, raw: _RawBatch, epoch: int, forced: int | None
    ) -> dict[str, Any] | None:
        """The batch as columns (``field -> (n, ...) array or list``), fixed-size fields gathered
        for all samples at once. Raises :class:`_Fallback` when that is not possible."""
        buf = raw.buf
        assert buf is not None
        block = self._block(raw)
        keys, heads = self._heads(raw, block)
        others = self._decode_others(raw, keys, block, heads) if self._others else {}
        columns: dict[str, Any] = {"__key__": keys}
        for name in self.fields or ():
            if name in others:
                columns[name] = others[name]
            else:
                columns[name] = self._gather(name, buf, raw, block, heads)
        if self.curriculum is not None:
            variants = self._variants(keys, epoch, forced)
            assert self._zero is not None
            out = np.zeros((len(keys), *self._zero.shape), dtype=self._zero.dtype)
            for j in range(len(self.curriculum.names)):
                name = self.curriculum.field_of(j)
                mask = variants == j
                if name is None or not mask.any():
                    continue
                out[mask] = self._gather(name, buf, raw, block, heads, mask)
            columns[self.curriculum.output] = out
            if self.curriculum.index_output:
                columns[self.curriculum.index_output] = variants
        return columns

    def _heads(self, raw: _RawBatch, block: np.ndarray | None) -> tuple[list[str], _Heads]:
        """The keys of the batch from the samples' first headers (their checksums checked),
        and what :meth:`_gather` needs to check member headers. A corrupt first header raises
        :class:`_Fallback`: the per-sample parse raises or skips it, naming its offset."""
        assert raw.buf is not None
        first = gather_rows(raw.buf, raw.start, BLOCK) if block is None else block
        ends = None if first is None else key_ends(first)
        if first is None or ends is None or not checksums_ok(first).all():
            raise _Fallback
        return key_strings(first, ends), _Heads(first[:, NAME], ends)

    def _block(self, raw: _RawBatch) -> np.ndarray | None:
        """The first ``_block_len`` bytes of every sample as one ``(n, L)`` array, when the
        batch's shards share one layout and the requested fields fill most of those bytes (one
        gather then serves keys, fields and the first variable header); else None."""
        if not self._block_len:
            return None
        ids = self._layout_id[raw.shard]
        if ids[0] < 0 or (ids != ids[0]).any():
            return None
        stops = raw.stop - raw.start
        if stops.min() < self._block_len:
            return None
        return gather_rows(raw.buf, raw.start, self._block_len)  # type: ignore[arg-type]

    def _gather(
        self,
        name: str,
        buf: np.ndarray,
        raw: _RawBatch,
        block: np.ndarray | None,
        heads: _Heads,
        mask: np.ndarray | None = None,
    ) -> Any:
        """Field ``name`` of the batch's samples (those in ``mask``) as one array, after checking
        that each gathered member header is this sample's member of the field, with a sound
        checksum (``heads``: from :meth:`_heads`)."""
        table = self._tables.get(name)
        if table is None:
            raise _Fallback
        rows = np.arange(len(raw.start)) if mask is None else np.flatnonzero(mask)
        if block is not None:
            offset = int(table.offsets[raw.shard[0]])
            span = block[:, offset - BLOCK : offset + table.nbytes]
            span = span if mask is None else span[mask]
            headers = span[:, :BLOCK]
        else:
            positions = table.positions(raw.start[rows], raw.shard[rows])
            headers = None if positions is None else gather_rows(buf, positions - BLOCK, BLOCK)
            if headers is None:
                raise _Fallback
        at = raw.start[rows] + table.offsets[raw.shard[rows]]
        walked = heads.walked.get(table.ext)
        if walked is None or not np.array_equal(walked[rows], at):  # else: checked in the walk
            ok = named_members(
                headers, heads.names[rows], heads.ends[rows], table.ext, table.nbytes
            )  # fmt: skip
            first = at - raw.start[rows] == BLOCK  # a first header: checked already
            if not first.all():
                ok &= first | checksums_ok(headers)
            for j in rows[~ok].tolist():
                self._check_member(name, table, raw, j)
        values = (
            table.from_block(span, BLOCK) if block is not None else table.gather(buf, positions)
        )
        if values is None:
            raise _Fallback
        return values

    def _check_member(self, name: str, table: FieldTable, raw: _RawBatch, j: int) -> None:
        """Sample ``j``'s member of field ``name`` where the layout puts it, checked by parsing
        the sample: the same bytes pass; a sample that does not parse is left to the per-sample
        path (:class:`_Fallback`); a member elsewhere means the manifest's layout does not
        describe this shard: a :class:`ShardFormatError` naming shard, sample and field."""
        start, stop, base = int(raw.start[j]), int(raw.stop[j]), int(raw.base[j])
        source = self.store.url(self.shards[raw.shard[j]])
        try:
            key, members = parse_sample(raw.data[j], start, stop, base_offset=base, source=source)
        except WdsLoaderError:
            raise _Fallback from None
        member = members.get(table.ext)
        if member is None:
            raise _Fallback  # the per-sample path names the missing field
        offset = int(table.offsets[raw.shard[j]])
        at = start + offset
        assert raw.buf is not None
        if member.nbytes == table.nbytes and member == raw.buf[at : at + table.nbytes].data:
            return
        header = raw.buf[at - BLOCK : at].tobytes()
        there = header[NAME].split(b"\0", 1)[0].decode("utf-8", "replace")
        sound = len(header) == BLOCK and checksum_ok(header)
        found = f"the header of {there!r}" if sound else "no such member header"
        raise ShardFormatError(
            f"{source}: sample {key!r}, field {name!r}: the manifest's layout puts the member "
            f"{key}.{table.ext} at byte {offset} of the sample (byte {base + at} of the shard), "
            f"where the shard has {found}: the manifest does not describe this shard (rebuild "
            "or re-adopt it; gather=False reads it by parsing)"
        )

    def _decode_others(
        self,
        raw: _RawBatch,
        keys: list[str],
        block: np.ndarray | None = None,
        heads: _Heads | None = None,
    ) -> dict[str, list[Any]]:
        """Decode the fields that are not gathered: their members are found for the whole batch
        at once (parsing only the headers after the constant-offset prefix), else per sample.
        The members found so (their headers checked) are noted in ``heads``."""
        assert raw.buf is not None
        parse_from = self._parse_from[raw.shard]
        first = None
        if block is not None:
            at = int(parse_from[0])
            first = block[:, at : at + BLOCK] if block.shape[1] >= at + BLOCK else None
        starts = raw.start + parse_from
        first_checked = heads is not None and bool((parse_from == 0).all())
        members = walk_members(raw.buf, starts, raw.stop, keys, first, first_checked)
        if members is None:
            return self._parse_others(raw, keys)
        if heads is not None:
            heads.walked.update({ext: found[0] for ext, found in members.items()})
        view = memoryview(raw.buf)  # type: ignore[arg-type]
        out: dict[str, list[Any]] = {}
        for field in self._others:
            ext, fn = self.decoder.field_decoder(field)
            found = members.get(ext)
            if found is None:
                raise _Fallback
            try:
                out[field] = [
                    fn(view[p : p + n])
                    for p, n in zip(found[0].tolist(), found[1].tolist(), strict=True)
                ]
            except Exception:  # the per-sample path words the error
                raise _Fallback from None
        return out

    def _parse_others(self, raw: _RawBatch, keys: list[str]) -> dict[str, list[Any]]:
        """:meth:`_decode_others` one sample at a time."""
        lists: list[list[Any]] = [[] for _ in self._others]
        parse_from = self._parse_from[raw.shard]
        joined = raw.data[0]
        for j, key in enumerate(keys):
            start, stop = int(raw.start[j]), int(raw.stop[j])
            source = self.store.url(self.shards[raw.shard[j]])
            try:
                got, members = parse_sample(
                    joined,
                    start + int(parse_from[j]),
                    stop,
                    base_offset=int(raw.base[j]),
                    source=source,
                )
                if got != key:
                    raise _Fallback
                for out, field in zip(lists, self._others, strict=True):
                    out.append(self.decoder.decode_field(members, key, source, field))
            except WdsLoaderError:
                raise _Fallback from None
        return dict(zip(self._others, lists, strict=True))

    def _skip(self, worker: int, what: str) -> None:
        """Count a skipped sample; raise once the rank skipped more than ``max_skipped``."""
        log.warning("skipping %s", what)
        self._last_skip = what
        self.control.add(worker, "skipped_samples")
        skipped = self.control.add_skipped(worker)
        if self.max_skipped is not None and skipped > self.max_skipped:
            raise SkipLimitError(
                f"on_error='skip': {skipped} samples skipped in this pass of rank {self.rank} "
                f"(split {self.split!r}), more than max_skipped={self.max_skipped}; "
                f"last error: {what}"
            )

    def _decode_samples(
        self, raw: _RawBatch, worker: int, epoch: int, forced: int | None, count: bool
    ) -> list[dict[str, Any]]:
        """Parse and decode each sample on its own (any tar flavour; errors name the sample)."""
        samples: list[dict[str, Any]] = []
        keys: list[str] = []
        for j in range(len(raw.start)):
            data = raw.data[j]
            shard = self.shards[raw.shard[j]]
            source = self.store.url(shard)
            local_index = int(raw.local[j])
            try:
                if isinstance(data, Exception):
                    raise data
                key, members = parse_sample(
                    data,
                    int(raw.start[j]),
                    int(raw.stop[j]),
                    base_offset=int(raw.base[j]),
                    source=source,
                )
                sample = self.decoder(members, key, source)
                if self.curriculum is not None:
                    variant = int(self._variants([key], epoch, forced)[0])
                    name = self.curriculum.field_of(variant)
                    value = (
                        self._zero.copy()  # type: ignore[union-attr]
                        if name is None
                        else self.decoder.decode_field(members, key, source, name)
                    )
                    sample[self.curriculum.output] = value
                    if self.curriculum.index_output:
                        sample[self.curriculum.index_output] = np.int64(variant)
            except WdsLoaderError as exc:
                if self.on_error == "raise":
                    raise type(exc)(f"{exc} (sample #{local_index} of {source})") from exc
                if count:
                    self._skip(worker, f"sample #{local_index} of {source}: {exc}")
                continue
            samples.append(sample)
            keys.append(key)
        return samples


def _collate_columns(collate_fn: Callable[..., Any], columns: dict[str, Any], n: int) -> Any:
    """Collate a batch held as columns: by the collator's column method when it has one,
    otherwise one dict per sample (rows of the gathered arrays are views)."""
    by_columns = getattr(collate_fn, "collate_columns", None)
    if by_columns is not None:
        return by_columns(columns)
    names = list(columns)
    cols = [columns[k] for k in names]
    return collate_fn([dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)])
