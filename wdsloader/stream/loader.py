"""``create_loader``: a torch DataLoader over one split of a built dataset, with exact resume."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from wdsloader import plan
from wdsloader.errors import StateMismatchError, WorkerDiedError
from wdsloader.format import FieldSpec, Manifest
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.stream.config import (
    MAX_WINDOW,
    MIN_SPANS,
    REMOTE_MIN_SPANS,
    REMOTE_SPAN_BYTES,
    SPAN_BYTES,
    WINDOW_BYTES,
    LoaderConfig,
    default_span_window,
    resolve_config,
)
from wdsloader.stream.dataset import ShardStreamDataset
from wdsloader.stream.inputs import node_readers, open_source, share_node
from wdsloader.stream.loader_options import loader_options
from wdsloader.stream.options import (
    DecodeOptions,
    ErrorPolicy,
    PlanOptions,
    Topology,
    WorkerOptions,
)
from wdsloader.stream.packing import packed_config, packing_fingerprint
from wdsloader.stream.prefetch import DevicePrefetcher
from wdsloader.stream.replay import StepSamples, step_samples
from wdsloader.stream.start_method import check_sendable
from wdsloader.stream.state import LoaderState, epoch_fingerprint, stage_fingerprint
from wdsloader.stream.telemetry import Hook, Telemetry
from wdsloader.stream.telemetry import all_ranks as all_ranks_metrics
from wdsloader.stream.threads import start_threads
from wdsloader.stream.workers import WorkerWatch

if TYPE_CHECKING:
    from wdsloader.mix.options import Mix
    from wdsloader.mix.source import MixSource
    from wdsloader.mix.store import MixStore
    from wdsloader.plan.packing import Packing

log = logging.getLogger(__name__)

__all__ = [
    "MAX_WINDOW",
    "MIN_SPANS",
    "REMOTE_MIN_SPANS",
    "REMOTE_SPAN_BYTES",
    "SPAN_BYTES",
    "WINDOW_BYTES",
    "DevicePrefetcher",
    "WdsDataLoader",
    "create_loader",
    "default_span_window",
    "set_epoch",
]


class WdsDataLoader(DataLoader):
    """A DataLoader whose batches are planned per rank and worker; see :func:`create_loader`.

    Adds ``dataset_obj`` (its ``dataset``, the :class:`ShardStreamDataset`, under the
    steering-dataset loader API's name), ``sampler_obj`` (None: the plan does the sampler's job),
    ``state_dict()``/``load_state_dict()`` (torchdata's StatefulDataLoader protocol;
    :meth:`state` gives the same as a :class:`~wdsloader.stream.state.LoaderState`),
    :meth:`set_epoch`, :meth:`force_variant` (alias ``force_steering``), :meth:`output_schema`,
    ``manifest`` (its ``dims`` bind the symbolic shapes of ``output_schema()``), and ``stats``.
    ``len(loader)`` is the number of batches this rank yields in a full epoch; iterating a
    loader to the end moves it to the next epoch. ``fingerprint`` (default: derived from the
    dataset) names each stage's config in the states it saves; ``worker_mode="thread"`` runs
    its ``num_workers`` workers on threads (see :class:`~wdsloader.stream.options.WorkerOptions`).
    """

    def __init__(
        self,
        dataset: ShardStreamDataset,
        *,
        fingerprint: Mapping[str, str] | None = None,
        worker_mode: str = "process",
        **kwargs: Any,
    ) -> None:
        # batches are collated inside the workers; torch's default_convert would walk them again
        with warnings.catch_warnings():
            if worker_mode == "thread":  # torch's advice on the count of worker processes
                warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            super().__init__(dataset, batch_size=None, collate_fn=_as_is, **kwargs)
        self.dataset_obj = dataset
        self.sampler_obj = None
        self.fingerprint: dict[str, str] = dict(
            fingerprint if fingerprint is not None else dataset_fingerprint(dataset)
        )
        self._pending: LoaderState | None = None  # loaded, not yet started
        # progress of the current iteration: where it began and the batches it yielded
        self._started_from: plan.Resume | None = None
        self._yielded = 0
        self._played: dict[int, plan.Resume] = {}  # epochs played from a resume point
        self.telemetry = Telemetry(counters=self.dataset_obj.counters)
        self.worker_mode = worker_mode if self.num_workers > 0 else "process"
        self._free: list[list[ShardStreamDataset | None]] = []  # thread workers' datasets

    # a generator over DataLoader's iterator (resume bookkeeping), not a _BaseDataLoaderIter
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.dataset_obj
        resume = None
        if self._pending is not None and self._pending.epoch == ds.epoch:
            resume = self._pending.plan_resume(ds.config, ds.num_batches)
        self._pending = None
        ds.set_resume(resume)
        self._started_from, self._yielded = resume, 0
        if resume is not None:
            self._played[ds.epoch] = resume
        else:
            self._played.pop(ds.epoch, None)
        telemetry, control, now = self.telemetry, ds.control, time.perf_counter_ns
        telemetry.start(ds.epoch, control)
        threads = None
        if self.worker_mode == "thread":
            threads = start_threads(ds, self._free, self.prefetch_factor or 2, self.pin_memory)
        watch = WorkerWatch(super().__iter__() if threads is None else threads, ds)
        try:
            while True:
                t0 = now()
                try:
                    batch = watch.next()
                except StopIteration:
                    break
                except WorkerDiedError:
                    self._iterator = None  # persistent workers: start a new pool next time
                    raise
                telemetry.waited(now() - t0)
                self._yielded += 1
                if telemetry.hooks:
                    telemetry.after_batch(control)
                yield batch
                del batch
        finally:
            if threads is not None:  # a loop that stops early leaves no thread running
                threads.close()
        ds.set_resume(None)
        ds.set_epoch(ds.epoch + 1)
        self._started_from, self._yielded = None, 0

    # -- state ---------------------------------------------------------------------------------
    def state(self) -> LoaderState:
        """The position: epoch, batches this rank yielded in it, the plan's parameters and what
        the loader reads (see :class:`~wdsloader.stream.state.LoaderState`)."""
        ds = self.dataset_obj
        if self._pending is not None:
            epoch, resume = (
                self._pending.epoch,
                self._pending.plan_resume(ds.config, ds.num_batches),
            )
        else:
            epoch = ds.epoch
            resume = plan.next_resume(ds.config, self._started_from, self._yielded)
        return LoaderState.capture(
            split=ds.split,
            epoch=epoch,
            config=ds.config,
            resume=resume,
            shards=ds.shards_digest,
            fingerprint={**self.fingerprint, **epoch_fingerprint(ds, epoch)},
        )

    def state_dict(self) -> dict[str, Any]:
        """:meth:`state` as a JSON-able dict."""
        return self.state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any] | LoaderState) -> None:
        """Continue from ``state``: the next iteration yields the batches that followed it.

        A different world size, worker count, batch size, drop_last or shuffle window re-plans
        the samples not yet consumed in that epoch over the new topology (each delivered once).
        A loader whose span was derived (``PlanOptions(span=None)``, the default) takes the
        state's span, from then on: the run that saved it continues with the same batches,
        whatever span this version derives. A state taken on other data, with another seed,
        shuffle, span given explicitly, fields, decoder options, curriculum, collator or plan
        version, or whose mix weights or curriculum schedule function returns other values at
        its epoch, is a :class:`~wdsloader.errors.StateMismatchError` naming what differs.
        """
        ds = self.dataset_obj
        loaded = LoaderState.from_dict(state.to_dict() if isinstance(state, LoaderState) else state)
        now = {**self.fingerprint, **epoch_fingerprint(ds, loaded.epoch)}
        config = ds.config
        if ds.loader_config.span_derived:
            config = dataclasses.replace(config, span=loaded.span)
        loaded.check(split=ds.split, config=config, shards=ds.shards_digest, fingerprint=now)
        before = ds.config.span
        self._plan_with(config.span)
        try:
            resume = loaded.plan_resume(ds.config, ds.num_batches)
        except StateMismatchError:
            self._plan_with(before)  # not loaded: the loader plans as it did
            raise
        ds.set_epoch(loaded.epoch)
        trivial = resume.batches_done == 0 and resume.prior is None
        self._pending = None if trivial else loaded
        self._started_from, self._yielded = None, 0

    def _plan_with(self, span: int) -> None:
        """Plan with ``span`` from now on: worker processes (persistent ones) and thread
        workers' copies made under another span are let go, to be made again."""
        ds = self.dataset_obj
        if span == ds.config.span:
            return
        ds.set_span(span)
        self._free.clear()
        self._iterator = None
        self._played.clear()

    # -- epoch and curriculum ------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration play ``epoch`` (shuffle order, curriculum), also inside
        persistent workers; a loaded state of another epoch is dropped."""
        if self._pending is not None and self._pending.epoch != epoch:
            self._pending = None
        self.dataset_obj.set_epoch(epoch)

    def force_variant(self, variant: str | None) -> None:
        """Give every sample the curriculum variant ``variant`` (e.g. for validation); None
        restores the schedule. Reaches persistent workers."""
        self.dataset_obj.force_variant(variant)

    force_steering = force_variant  # the steering-dataset loader API's name, kept as an alias

    def output_schema(self) -> dict[str, FieldSpec]:
        """The :class:`~wdsloader.format.FieldSpec` of every field a batch holds (before
        collation)."""
        return self.dataset_obj.output_schema()

    @property
    def padding(self) -> int:
        """Samples repeated this epoch so every rank gets the same batches (drop_last=False)."""
        return self.dataset_obj.padding()

    @property
    def dropped(self) -> int:
        """Samples left out this epoch so every batch is full (drop_last=True)."""
        return self.dataset_obj.dropped()

    @property
    def manifest(self) -> Manifest:
        """The manifest this loader reads (for a mix of sources, their combined schema and
        ``dims``): e.g. ``validate_batch(batch, loader.output_schema(),
        dims=loader.manifest.dims)``."""
        return self.dataset_obj.manifest

    @property
    def stats(self) -> dict[str, int]:
        """Counters summed over workers, **cumulative** since the loader was made (over every
        epoch; :meth:`set_epoch` and :meth:`load_state_dict` do not reset them): samples,
        batches, skipped_samples, skipped_batches (batches whose every sample failed, yielded
        with stand-in samples), gathered_batches (decoded as whole-batch columns, no sample
        parsed one by one; a batch mixing shards of several layouts included), parsed_batches and
        parsed_samples (batches in which samples were parsed one by one, off the whole-batch
        path, and how many such samples: a shard that does not fit its layout shows here);
        reading several sources, also
        ``samples/<name>`` per source. Workers count what they made, so mid-epoch the counts
        include batches prefetched but not yet yielded; after a full epoch, the difference of two
        readings is that epoch's."""
        return self.dataset_obj.counters()

    def metrics(self, all_ranks: bool = False) -> dict[str, float]:
        """Where this rank's time went in the current (or last) epoch's iteration: ``wait_s``
        (the training loop waited in ``next`` for batches), ``fetch_s``, ``decode_s`` and
        ``collate_s`` (summed over workers: with workers, they overlap the wait), bytes read,
        requests, cache hits, samples and batches; reading a mix, ``samples/<name>`` per
        source. ``all_ranks=True`` (every rank must call it: a collective) gives the mean over
        the process group and ``max_wait_s``, the slowest rank's wait."""
        out = self.telemetry.metrics(self.dataset_obj.control)
        return all_ranks_metrics(out) if all_ranks else out

    def add_metrics_hook(self, hook: Hook, every: int = 100) -> None:
        """Call ``hook(metrics, batches)`` every ``every`` batches (e.g.
        ``wdsloader.stream.TensorBoardReporter(writer)``, ``LoggingReporter()``, or a function
        calling ``wandb.log``)."""
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.telemetry.hooks.append((hook, every))

    def batch_indices(self, epoch: int, step: int) -> StepSamples:
        """The samples of this rank's batch ``step`` (0-based from the start of ``epoch``),
        from the plan alone (no data is read): their positions in their split (what
        :class:`~wdsloader.ShardDataset` indexes and batches carry as ``__index__``), and for a
        mix their sources. The same after a resume; a step played before an elastic resume
        (under another topology) is a ValueError."""
        ds, pending = self.dataset_obj, self._pending
        if pending is not None and pending.epoch == epoch:
            resume: plan.Resume | None = pending.plan_resume(ds.config, ds.num_batches)
        else:
            resume = self._played.get(epoch)
        return step_samples(ds, epoch, step, resume)


def _as_is(batch: Any) -> Any:
    return batch


def dataset_fingerprint(
    dataset: ShardStreamDataset, collate: str | Callable[..., Any] | None = None
) -> dict[str, str]:
    """The stage fingerprint of a loader over ``dataset`` (``collate``: the collator's
    registered name, when it has one; else the dataset's collate function is named)."""
    packer = dataset.loader_config.packing
    return stage_fingerprint(
        fields=dataset.fields,
        allow_pickle=dataset.decoder.allow_pickle,
        curriculum=dataset.curriculum,
        collate=collate if collate is not None else dataset.collate_fn,
        mix=None if dataset.mix is None else dataset.mix.fingerprint(),
        packing=None if packer is None else packing_fingerprint(packer),
    )


def set_epoch(loader: Any, epoch: int) -> None:
    """Alias of ``loader.set_epoch(epoch)`` (:meth:`WdsDataLoader.set_epoch`, and the loaders
    of ``wdsloader.training.DataLoaderFactory``), kept for existing training loops; for a plain
    torch DataLoader, its sampler's ``set_epoch`` (e.g. a ``DistributedSampler``)."""
    method = getattr(loader, "set_epoch", None)
    if method is None:
        batch_sampler = getattr(loader, "batch_sampler", None)
        sampler = getattr(batch_sampler, "sampler", getattr(loader, "sampler", None))
        method = getattr(sampler, "set_epoch", None)
    if not callable(method):
        raise TypeError(
            "set_epoch expects a loader made by wdsloader.create_loader or DataLoaderFactory, "
            f"or a DataLoader whose sampler has set_epoch; got {type(loader).__name__}"
        )
    method(epoch)


def build_dataset(
    config: LoaderConfig, manifest: Manifest, store: ShardStore | MixStore
) -> ShardStreamDataset:
    """The per-worker dataset a :class:`LoaderConfig` describes, set to its epoch."""
    return ShardStreamDataset(config, manifest, store)


def build_loader(config: LoaderConfig, dataset: ShardStreamDataset) -> WdsDataLoader:
    """The DataLoader over ``dataset`` (checked sendable to its workers' start method)."""
    kwargs = dict(config.loader_kwargs)
    if kwargs["num_workers"] > 0 and config.worker_mode == "process":
        check_sendable(dataset, kwargs["multiprocessing_context"])
    collate_name = config.collate if isinstance(config.collate, str) else None
    return WdsDataLoader(
        dataset, fingerprint=dataset_fingerprint(dataset, collate_name),
        worker_mode=config.worker_mode, **kwargs,
    )  # fmt: skip


def create_loader(
    source: str | os.PathLike[str] | Mix | Sequence[MixSource],
    split: str,
    batch_size: int,
    num_workers: int = 0,
    distributed: bool = False,
    epoch: int = 0,
    drop_last: bool | None = None,
    pin_memory: bool = True,
    *,
    shuffle: bool | None = None,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    collate_fn: str | Callable[[list[dict[str, Any]]], Any] | None = None,
    plan: PlanOptions | None = None,
    topology: Topology | None = None,
    workers: WorkerOptions | None = None,
    read_options: ReadOptions | None = None,
    decode: DecodeOptions | None = None,
    errors: ErrorPolicy | None = None,
    packing: Packing | None = None,
    **deprecated: Any,
) -> WdsDataLoader:
    """A DataLoader over ``split`` of the dataset at ``source`` (a path or fsspec URL), or of
    several datasets mixed sample by sample (a :class:`~wdsloader.mix.Mix`; a plain list of
    :class:`~wdsloader.mix.MixSource` is short for ``Mix(list)``).

    Every rank yields exactly ``len(loader)`` batches; across ranks and workers each sample comes
    once per epoch (``drop_last=True`` drops fewer than ``world_size * batch_size``;
    ``drop_last=False`` repeats as few samples as needed to make ranks equal). ``drop_last``
    defaults to True for ``train`` and False otherwise; shuffling (by ``seed``) to ``train``
    only. The first eight parameters, up to ``pin_memory`` (which takes effect only with CUDA),
    may be given by position. ``distributed=True`` takes the data-parallel rank and size from
    ``torch.distributed``; ``topology`` gives them instead (or a device mesh).
    ``storage_options`` go to fsspec (credentials, endpoint). ``collate_fn`` is a callable or
    the name of a collator in :class:`~wdsloader.collate.CollatorRegistry` (default: the
    manifest's ``loader_defaults["collate"]`` or ``"default"``).

    The rest is one option object per concern, each checking itself when made (a combination
    that cannot be meant is a ValueError naming the fields): ``plan``
    (:class:`~wdsloader.stream.options.PlanOptions`: span, shuffle window), ``topology``
    (:class:`~wdsloader.stream.options.Topology`), ``workers``
    (:class:`~wdsloader.stream.options.WorkerOptions`: persistent workers, prefetch, start
    method), ``read_options`` (:class:`~wdsloader.io.ReadOptions`: retries, timeouts, cache,
    checksums; also for the manifest's read), ``decode``
    (:class:`~wdsloader.stream.options.DecodeOptions`: fields, curriculum, collate options,
    pickle) and ``errors`` (:class:`~wdsloader.stream.options.ErrorPolicy`: raise or skip).
    ``storage_options`` given here and otherwise in ``read_options`` is a ValueError. A
    worker that dies raises :class:`~wdsloader.errors.WorkerDiedError` (a RuntimeError).

    The keywords these objects replace (``shuffle_window``, ``fields``, ``cache_dir``,
    ``on_error``, ``weights`` ... see
    :data:`~wdsloader.stream.loader_options.DEPRECATED`) still work until wdsloader 0.2.0,
    with a ``DeprecationWarning`` naming the replacement; one that contradicts its object's
    field is a ValueError.
    """
    root, options = loader_options(
        source, deprecated, storage_options=storage_options,
        split=split, batch_size=batch_size, num_workers=num_workers, distributed=distributed,
        epoch=epoch, drop_last=drop_last, pin_memory=pin_memory, shuffle=shuffle, seed=seed,
        collate_fn=collate_fn, plan=plan, topology=topology, workers=workers,
        read_options=read_options, decode=decode, errors=errors, packing=packing,
    )  # fmt: skip
    rank, world = options.topology.resolve(distributed)
    store, manifest, mix = open_source(root, options)
    share_node(store, node_readers(world, options.num_workers))
    config = resolve_config(
        manifest, options, rank=rank, world_size=world, remote=not store.reads_locally, mix=mix
    )
    if options.packing is not None:
        assert isinstance(store, ShardStore)  # packing refuses a mix
        config = packed_config(config, options.packing, manifest, store, options.collate_fn)
    loader = build_loader(config, build_dataset(config, manifest, store))
    shown = store.redact(root) if mix is None else "+".join(mix.names)
    log.info(
        "%s/%s rank %d/%d: %d batches of %d per epoch, %d samples repeated, %d left out",
        shown, split, rank, world, len(loader), batch_size, loader.padding, loader.dropped,
    )  # fmt: skip
    return loader
