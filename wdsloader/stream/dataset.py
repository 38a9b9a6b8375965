"""The per-worker executor: turns the plan's sample ids into decoded, collated batches.

:class:`ShardStreamDataset` composes the batch reader (:mod:`wdsloader.stream.reader`: byte
ranges, coalesced reads into pooled buffers, read-ahead), the columnar decoder
(:mod:`wdsloader.decode.columnar`) and the row decoder (:mod:`wdsloader.decode.rows`), and owns
the policies: which decoder a batch takes, ``on_error`` and its budget, the stand-in batches
of :meth:`ShardStreamDataset._refill`, and the counters shared with the main process.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsloader import batch_arrays, plan
from wdsloader.collate.batch import collate_columns
from wdsloader.decode.batch import Columns, RawBatch
from wdsloader.decode.columnar import ColumnarDecoder
from wdsloader.decode.registry import SampleDecoder
from wdsloader.decode.rows import RowDecoder
from wdsloader.decode.variants import Variants
from wdsloader.errors import SkipLimitError, WdsLoaderError
from wdsloader.format import FieldSpec, Manifest, ShardInfo
from wdsloader.io.store import Store
from wdsloader.mix.runtime import SourceTags
from wdsloader.plan.uses import shard_uses
from wdsloader.stream.ahead import DECODE_AHEAD, made_ahead
from wdsloader.stream.collected import close_when_collected
from wdsloader.stream.config import LoaderConfig
from wdsloader.stream.control import Control
from wdsloader.stream.dataset_config import (
    check_config,
    dataset_collate,
    dataset_decoder,
    dataset_planner,
    loader_config,
)
from wdsloader.stream.parent_watch import watch_parent
from wdsloader.stream.provenance import Provenance
from wdsloader.stream.reader import BatchReader
from wdsloader.stream.refill import Refill as _Refill
from wdsloader.stream.shm_batches import BlockRing
from wdsloader.stream.state import resume_from_dict, resume_to_dict, shards_digest
from wdsloader.stream.telemetry import StageClock

log = logging.getLogger(__name__)


class ShardStreamDataset(IterableDataset):
    """An IterableDataset that yields whole batches of one split, planned by :mod:`wdsloader.plan`.

    Each DataLoader worker computes its own list of batches from the plan (no coordination),
    reads the byte ranges those samples occupy (coalesced, one group of batches ahead), gathers
    fixed-size fields for the whole batch from the shard layout (decoding a batch that does not
    fit the layout sample by sample), decodes only the requested fields, applies the curriculum
    and collates inside the worker. ``len()`` is the number of batches this rank yields in a
    full epoch, also with ``on_error="skip"`` (see :meth:`_refill`); more than ``max_skipped``
    skipped samples in one pass of a rank (None: no limit) raise
    :class:`~wdsloader.errors.SkipLimitError`.
    """

    def __init__(
        self,
        config: LoaderConfig | plan.PlanConfig,
        manifest: Manifest,
        store: Store,
        *,
        decoder: SampleDecoder | None = None,
        collate_fn: Callable[[list[dict[str, Any]]], Any] | None = None,
        **deprecated: Any,
    ) -> None:
        """The dataset ``config`` (a :class:`~wdsloader.stream.LoaderConfig`, as
        :func:`~wdsloader.create_loader` resolves it) describes over ``manifest``'s split, read
        through ``store``, starting at ``config.epoch``. ``decoder`` and ``collate_fn`` default
        to those of the config. The keywords of earlier versions (``config`` a ``PlanConfig``,
        ``split=``, ``rank=``, ``on_error=``...) still work until 0.2.0, with a warning."""
        super().__init__()
        if isinstance(config, plan.PlanConfig):
            config = loader_config(config, decoder, collate_fn, deprecated)
        elif deprecated:
            raise TypeError(f"ShardStreamDataset() got unexpected keywords {sorted(deprecated)}")
        check_config(config)
        self.loader_config, self.config, self.rank = config, config.plan, config.rank
        self.manifest, self.split, self.store = manifest, config.split, store
        self.shards: list[ShardInfo] = list(manifest.split(self.split).shards)
        self.shards_digest = shards_digest(self.shards)
        # a loader that is collected without finishing an iteration closes its files too
        close_when_collected(self, store)
        self.decoder = decoder if decoder is not None else dataset_decoder(config, manifest)
        self.collate_fn = (
            collate_fn if collate_fn is not None else dataset_collate(config, manifest)
        )
        self.on_error, self.max_skipped = config.on_error, config.max_skipped
        self._last_skip = ""  # the last error skipped in this process
        self.readahead_batches = max(1, config.readahead_batches)
        # batches decoded ahead on a thread at num_workers=0 (0: in the loop's thread)
        self.decode_ahead = DECODE_AHEAD
        self.curriculum = config.curriculum
        self.control = Control(self.config.num_workers)
        self.control.epoch = config.epoch
        self.mix = mix = config.mix
        self.planner = dataset_planner(config)
        self._tags = None if mix is None else SourceTags(mix, self.config.num_workers)
        self.provenance = Provenance(self.config.counts, mix)
        self._collate_ns = 0  # the collate function's time in the batch being made
        self._decoders(config.gather)

    def _decoders(self, gather: bool) -> None:
        """The fields decoded, the curriculum's variants, the reader and the decoders."""
        manifest, store, decoder = self.manifest, self.store, self.decoder
        schema, curriculum = manifest.schema, self.curriculum
        self.fields: tuple[str, ...] | None = (
            decoder.fields if decoder.fields is not None
            else tuple(decoder.schema) if decoder.schema is not None
            else None  # schema-less: whatever the samples hold
        )  # fmt: skip
        self.variants = (
            None
            if curriculum is None
            else Variants(curriculum, schema, manifest.dims, self.fields, self.config.seed)
        )
        self.sources = [store.url(s) for s in self.shards]  # shard names in errors
        self.reader = BatchReader(store, self.shards, self.config.counts, self.on_error == "skip")
        self.rows = RowDecoder(decoder, self.sources, self.variants)
        self.columnar: ColumnarDecoder | None = None
        if gather and schema and self.fields is not None:
            columnar = ColumnarDecoder(
                schema, self.fields, manifest.dims, self.shards, self.sources, decoder,
                self.variants,
            )  # fmt: skip
            self.columnar = columnar if columnar.useful else None
            if self.columnar is not None:
                self.reader.placement = self.columnar.placement()

    def set_span(self, span: int) -> None:
        """Plan with ``span`` (a loaded state's) instead of the config's; the rest of the
        config is kept. Workers made before (processes or thread copies) keep the old plan."""
        packing = self.loader_config.packing
        config = dataclasses.replace(self.config, span=span)
        if packing is not None:
            packing = plan.PackPlanner(config, packing.packing, packing.lengths)
        self.loader_config = dataclasses.replace(self.loader_config, plan=config, packing=packing)
        self.config, self.planner = config, dataset_planner(self.loader_config)

    # -- epoch / resume / curriculum -----------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays (also inside persistent workers)."""
        self.control.epoch = epoch

    def force_variant(self, variant: str | None) -> None:
        """Give every sample the curriculum variant ``variant`` (e.g. for validation); None
        restores the schedule. Reaches persistent workers."""
        if self.curriculum is None:
            raise ValueError("this loader has no curriculum (pass curriculum= to create_loader)")
        self.control.forced = None if variant is None else self.curriculum.index(variant)

    @property
    def forced_variant(self) -> str | None:
        """The variant forced by :meth:`force_variant`, or None."""
        index = self.control.forced
        return None if index is None or self.curriculum is None else self.curriculum.names[index]

    # the steering-dataset loader API's names, kept as aliases
    force_steering, forced_steering = force_variant, forced_variant

    def output_schema(self) -> dict[str, FieldSpec]:
        """The :class:`FieldSpec` of every field a batch holds (before collation)."""
        schema = self.manifest.schema
        out = {f: schema[f] for f in (self.fields or ()) if f in schema}
        if self.variants is not None:
            out.update(self.variants.specs)
        return out

    def __len__(self) -> int:
        return self.num_batches(self.control.epoch)

    # -- the plan -----------------------------------------------------------------------------
    def num_batches(self, epoch: int, resume: plan.Resume | None = None) -> int:
        """Batches every rank yields in ``epoch`` (from ``resume`` on)."""
        return self.planner.num_batches(epoch, resume)

    def padding(self) -> int:
        """Samples repeated in the current epoch so every rank gets the same batches."""
        return self.planner.padding(self.epoch)

    def dropped(self) -> int:
        """Samples left out of the current epoch so every batch is full."""
        return self.planner.dropped(self.epoch)

    def worker_batches(
        self, epoch: int, worker: int, resume: plan.Resume | None
    ) -> Sequence[np.ndarray]:
        """The split-wide sample ids of each batch DataLoader worker ``worker`` yields."""
        return self.planner.worker_batches(epoch, self.rank, worker, resume)

    def counters(self) -> dict[str, int]:
        """Counters summed over workers; with a mix also ``samples/<source name>``."""
        out = self.control.counters()
        if self._tags is not None:
            out.update(self._tags.counters())
        return out

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
        if info is None:
            yield from self.iter_worker(worker, ahead=True)
            return
        watch_parent()  # a worker process: it ends with the training process
        ring = BlockRing()  # its batches reach the training process through reused blocks
        batch_arrays.set_lender(ring.lend)  # decoded images are made in them
        try:
            for batch in self.iter_worker(worker):
                yield ring.pack(batch)
                del batch
        finally:
            batch_arrays.set_lender(None)
            ring.close()

    def iter_worker(self, worker: int, *, ahead: bool = False) -> Generator[Any, None, None]:
        """The batches of plan worker ``worker`` in this iteration, made in this thread
        (``ahead``: in the training loop's process, decoded ahead on a thread when that pays)."""
        batches = self.worker_batches(self.control.epoch, worker, self.resume_point())
        if ahead and self.decode_ahead and _in_main_thread(self.config.num_workers):
            # no worker process: the batches are decoded on a thread while the loop's step runs
            yield from made_ahead(self._iter_batches(batches, worker), self.decode_ahead)
        else:
            yield from self._iter_batches(batches, worker)

    def peek_batch(self) -> Any:
        """The first batch the next iteration yields, made in this process; what the loader
        yields afterwards, its counters and its state do not change."""
        epoch, resume = self.control.epoch, self.resume_point()
        for worker in range(self.config.num_workers):
            batches = self.worker_batches(epoch, worker, resume)
            if batches:
                (raw,) = self.reader.read(batches[:1])
                forced, layout = self.control.forced, _layout(batches, 0)
                return self._make_batch(raw, worker, epoch, forced, count=False, layout=layout)
        raise ValueError(f"split {self.split!r} yields no batch on rank {self.rank}")

    def _iter_batches(self, batches: Sequence[np.ndarray], worker: int) -> Iterator[Any]:
        self.control.start_pass(worker)
        if not batches:
            return
        epoch, forced = self.control.epoch, self.control.forced
        refill, now = _Refill(), StageClock.now
        clock = StageClock(getattr(self.store, "stats", {}))
        cache = self.store if getattr(self.store, "plans_eviction", False) else None
        if cache is not None:  # a bounded cache: say when this pass reads each shard
            uses = shard_uses(batches, self.config.counts)
            claims = [(self.shards[s], a, b) for s, a, b in uses]
            cache.expect_reads(claims, epoch=epoch)  # type: ignore[attr-defined]
        ahead = self.reader.read_ahead(batches, self.readahead_batches)
        try:
            index = 0  # of the batch in ``batches``
            while True:
                t0 = now()
                raws = ahead.next_group()
                if cache is not None and raws is not None:
                    cache.reads_done(index + len(raws))  # type: ignore[attr-defined]
                self.control.add_metrics(worker, {"fetch_ns": now() - t0})
                clock.io(self.control, worker, getattr(self.store, "stats", {}))
                if raws is None:
                    break
                for raw in raws:
                    t0, self._collate_ns = now(), 0
                    layout = _layout(batches, index)
                    batch = self._make_batch(raw, worker, epoch, forced, layout=layout)
                    if batch is None:  # every sample failed: never yield fewer batches
                        batch = self._refill(refill, batches, index, worker, epoch, forced)
                    spent = {"decode_ns": now() - t0 - self._collate_ns}
                    self.control.add_metrics(worker, {**spent, "collate_ns": self._collate_ns})
                    index += 1
                    yield batch
                    del batch
                # the group's buffer goes back to the pool once nothing refers to it: drop
                # this loop's references before the read after the next one takes a buffer
                del raws, raw
        finally:
            ahead.close()

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
        decode = functools.partial(self._decode_rows, worker=worker, epoch=epoch, forced=forced)
        where = f"worker {worker} on rank {self.rank}"
        refill.search(index, batches, self.reader, decode, where, self.split, self._last_skip)
        samples = [dict(sample) for sample in refill.samples or []]
        if self._tags is not None:
            self._tags.take(samples)
        layout = _layout(batches, refill.found)
        return self.provenance.ensure(self._collate(samples, layout), samples)

    # -- decoding ------------------------------------------------------------------------------
    def _make_batch(
        self,
        raw: RawBatch,
        worker: int,
        epoch: int,
        forced: int | None,
        count: bool = True,
        layout: list[plan.packing.Pack] | None = None,
    ) -> Any:
        """Decode and collate one batch (None when every sample was skipped): as columns
        unless the batch is not gatherable, then sample by sample; ``layout``: its packs."""
        if count:
            self.control.set_reading(worker, int(raw.shard[0]))
        decoded = None if self.columnar is None else self.columnar.decode(raw, epoch, forced)
        if isinstance(decoded, Columns):
            columns = decoded.columns
            tags = self._tags
            if tags is not None:
                tags.tag_columns(columns, tags.of(raw.shard))
            columns.update(self.provenance.of(raw.shard, raw.local))
            if decoded.errors:
                for j, exc in decoded.errors.items():
                    self._failed(raw, j, exc, worker, count)
                columns = decoded.without(decoded.errors)
            n = len(columns["__key__"])
            if count and tags is not None:
                tags.count(worker, np.delete(tags.of(raw.shard), list(decoded.errors)))
            if count:
                self.control.add(worker, "samples", n)
                self.control.add(worker, "batches")
                if decoded.parsed:  # members found by parsing samples one by one
                    self.control.add(worker, "parsed_batches")
                    self.control.add(worker, "parsed_samples", decoded.parsed)
                else:
                    self.control.add(worker, "gathered_batches")
            if not n:
                return None
            return self.provenance.ensure(self._collate(columns, layout), columns)
        samples = self._decode_rows(raw, worker, epoch, forced, count)
        if self._tags is not None:
            src = self._tags.take(samples)
            if count:
                self._tags.count(worker, src)
        if count:
            self.control.add(worker, "samples", len(samples))
            self.control.add(worker, "batches")
            self.control.add(worker, "parsed_batches")
            self.control.add(worker, "parsed_samples", len(raw))
        if not samples:
            return None
        return self.provenance.ensure(self._collate(samples, layout), samples)

    def _collate(
        self, batch: list[dict[str, Any]] | dict[str, Any], layout: list[Any] | None = None
    ) -> Any:
        """The collate function on samples (or on columns, a dict), its time counted; packed
        by the plan's ``layout`` when it packs."""
        t0 = StageClock.now()
        if layout is not None:
            out = self.collate_fn.collate_planned(batch, layout)  # type: ignore[attr-defined]
        elif isinstance(batch, dict):
            out = collate_columns(self.collate_fn, batch)
        else:
            out = self.collate_fn(batch)
        self._collate_ns += StageClock.now() - t0
        return out

    def _decode_rows(
        self, raw: RawBatch, worker: int, epoch: int, forced: int | None, count: bool
    ) -> list[dict[str, Any]]:
        """The samples of ``raw`` decoded one by one (those that fail raised or skipped)."""
        samples: list[dict[str, Any]] = []
        src = None if self._tags is None else self._tags.of(raw.shard)
        provenance = self.provenance.of(raw.shard, raw.local)
        for j, sample in self.rows.decode(raw, epoch, forced):
            if isinstance(sample, WdsLoaderError):
                self._failed(raw, j, sample, worker, count)
            else:
                if src is not None:
                    sample[SourceTags.KEY] = int(src[j])
                sample.update({name: values[j] for name, values in provenance.items()})
                samples.append(sample)
        return samples

    def _failed(self, raw: RawBatch, j: int, exc: WdsLoaderError, worker: int, count: bool) -> None:
        """Sample ``j`` of ``raw`` failed with ``exc``: raise it naming the sample
        (on_error="raise"), or skip it (counted unless ``count`` is False)."""
        where = f"sample #{int(raw.local[j])} of {self.sources[raw.shard[j]]}"
        if self.on_error == "raise":
            raise type(exc)(f"{exc} ({where})") from exc
        if count:
            self._skip(worker, f"{where}: {exc}")

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


def _layout(batches: Sequence[np.ndarray], index: int) -> list[plan.packing.Pack] | None:
    """The packs of batch ``index`` when the plan packs (None otherwise)."""
    return batches.layout(index) if isinstance(batches, plan.PackBatches) else None


def _in_main_thread(num_workers: int) -> bool:
    """Whether the batches of a plan for ``num_workers`` are being asked for by the process's
    main thread with no worker (the training loop's, at ``num_workers=0``)."""
    return num_workers == 1 and threading.current_thread() is threading.main_thread()
