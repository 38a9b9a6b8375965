"""``create_loader``: a torch DataLoader over one split of a built dataset, with exact resume."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from wdsloader import plan
from wdsloader.errors import WorkerDiedError
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
    resolve_read_options,
)
from wdsloader.stream.dataset import ShardStreamDataset
from wdsloader.stream.inputs import open_dataset, rank_and_world
from wdsloader.stream.prefetch import DevicePrefetcher
from wdsloader.stream.start_method import check_sendable
from wdsloader.stream.state import LoaderState, epoch_fingerprint, stage_fingerprint
from wdsloader.stream.workers import WorkerWatch

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum
    from wdsloader.curriculum.schedule import Schedule
    from wdsloader.mix.source import MixSource
    from wdsloader.mix.spec import MixSpec
    from wdsloader.mix.store import MixStore

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
    dataset) names each stage's config in the states it saves.
    """

    def __init__(
        self,
        dataset: ShardStreamDataset,
        *,
        fingerprint: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        # batches are collated inside the workers; torch's default_convert would walk them again
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

    # a generator over DataLoader's iterator (resume bookkeeping), not a _BaseDataLoaderIter
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.dataset_obj
        resume = None
        if self._pending is not None and self._pending.epoch == ds.epoch:
            resume = self._pending.plan_resume(ds.config, ds.num_batches)
        self._pending = None
        ds.set_resume(resume)
        self._started_from, self._yielded = resume, 0
        watch = WorkerWatch(super().__iter__(), ds)
        while True:
            try:
                batch = watch.next()
            except StopIteration:
                break
            except WorkerDiedError:
                self._iterator = None  # persistent workers: start a new pool next time
                raise
            self._yielded += 1
            yield batch
            del batch
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
        A state taken on other data, with another seed, shuffle, span, fields, decoder options,
        curriculum, collator or plan version, or whose mix weights or curriculum schedule function
        returns other values at its epoch, is a
        :class:`~wdsloader.errors.StateMismatchError` naming what differs.
        """
        ds = self.dataset_obj
        loaded = LoaderState.from_dict(state.to_dict() if isinstance(state, LoaderState) else state)
        now = {**self.fingerprint, **epoch_fingerprint(ds, loaded.epoch)}
        loaded.check(split=ds.split, config=ds.config, shards=ds.shards_digest, fingerprint=now)
        resume = loaded.plan_resume(ds.config, ds.num_batches)
        ds.set_epoch(loaded.epoch)
        trivial = resume.batches_done == 0 and resume.prior is None
        self._pending = None if trivial else loaded
        self._started_from, self._yielded = None, 0

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
        with stand-in samples), gathered_batches (decoded as columns), parsed_batches and
        parsed_samples (batches in which samples were parsed one by one, off the whole-batch
        path, and how many such samples: a shard that does not fit its layout shows here);
        reading several sources, also
        ``samples/<name>`` per source. Workers count what they made, so mid-epoch the counts
        include batches prefetched but not yet yielded; after a full epoch, the difference of two
        readings is that epoch's."""
        return self.dataset_obj.counters()


def _as_is(batch: Any) -> Any:
    return batch


def dataset_fingerprint(
    dataset: ShardStreamDataset, collate: str | Callable[..., Any] | None = None
) -> dict[str, str]:
    """The stage fingerprint of a loader over ``dataset`` (``collate``: the collator's
    registered name, when it has one; else the dataset's collate function is named)."""
    return stage_fingerprint(
        fields=dataset.fields,
        allow_pickle=dataset.decoder.allow_pickle,
        curriculum=dataset.curriculum,
        collate=collate if collate is not None else dataset.collate_fn,
        mix=None if dataset.mix is None else dataset.mix.fingerprint(),
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
    if kwargs["num_workers"] > 0:
        check_sendable(dataset, kwargs["multiprocessing_context"])
    collate_name = config.collate if isinstance(config.collate, str) else None
    return WdsDataLoader(dataset, fingerprint=dataset_fingerprint(dataset, collate_name), **kwargs)


def create_loader(
    dataset_dir: str | os.PathLike[str] | Sequence[MixSource],
    split: str,
    batch_size: int,
    num_workers: int = 0,
    distributed: bool = False,
    epoch: int = 0,
    drop_last: bool | None = None,
    pin_memory: bool = True,
    *,
    seed: int = 0,
    shuffle: bool | None = None,
    shuffle_window: int | None = None,
    span: int | None = None,
    fields: Sequence[str] | None = None,
    collate_fn: str | Callable[[list[dict[str, Any]]], Any] | None = None,
    collate_options: Mapping[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit_bytes: int | None = None,
    allow_pickle: bool = False,
    on_error: str = "raise",
    verify_checksum: bool | None = None,
    check_shards: bool = True,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    device_mesh: Any = None,
    dp_dim: str | None = None,
    read_options: ReadOptions | None = None,
    multiprocessing_context: Any = None,
    curriculum: Curriculum | Mapping[str, Any] | bool | None = None,
    gather: bool = True,
    max_skipped: int | None = None,
    weights: Schedule | None = None,
    epoch_samples: int | None = None,
    batching: str | None = None,
    source_field: str | None = None,
) -> WdsDataLoader:
    """A DataLoader over ``split`` of the dataset at ``dataset_dir`` (a path or fsspec URL), or
    of several datasets mixed sample by sample (a list of :class:`~wdsloader.mix.MixSource`).

    Every rank yields exactly ``len(loader)`` batches; across ranks and workers each sample comes
    once per epoch (``drop_last=True`` drops fewer than ``world_size * batch_size``;
    ``drop_last=False`` repeats as few samples as needed to make ranks equal). ``drop_last``
    defaults to True for ``train`` and False otherwise; shuffling to ``train`` only. The first
    eight parameters, up to ``pin_memory``, may be given by position (``dataset_dir, split,
    batch_size, num_workers, distributed, epoch, drop_last, pin_memory``, the order scripts
    written for the first ``create_loader`` use); the others are keyword-only.

    ``span`` (samples read together from one shard) and ``shuffle_window`` (samples a worker
    shuffles among) default to sizes derived from the average sample size (256 KiB and 64 MiB
    of data). ``fields`` limits decoding to those fields. ``collate_fn`` is a callable or the
    name of a collator in :class:`~wdsloader.collate.CollatorRegistry` (default: the
    manifest's ``loader_defaults["collate"]`` or ``"default"``), made with ``collate_options``
    (e.g. ``{"tokenizer": tok}`` for ``"text"``). ``rank``/``world_size`` are the data-parallel
    rank and size: every rank of a model-parallel (tensor, pipeline, sequence) group passes the
    same ``rank`` and gets the same batches. ``device_mesh`` (a torch ``DeviceMesh``) gives them
    as the local rank and size of its dimension ``dp_dim`` (default ``"dp"``);
    ``distributed=True`` takes them from ``torch.distributed`` (global rank and world size:
    plain data parallelism only).
    ``pin_memory`` takes effect only with CUDA.

    ``curriculum`` (a :class:`~wdsloader.curriculum.Curriculum` or its dict) replaces the stored
    variant fields by one output field drawn per sample and epoch; None uses the manifest's
    default (``loader_defaults["curriculum"]``; left out when ``fields`` omits its output),
    False none. ``gather=False`` turns off the whole-batch read of fixed-size fields (every
    sample is then parsed on its own).

    ``multiprocessing_context`` (``"fork"``, ``"spawn"``, ``"forkserver"`` or a context) picks
    how workers start; under spawn/forkserver a collator, decoder or schedule that cannot be
    pickled (a lambda, a closure) is a ValueError here, naming it.

    ``read_options`` (a :class:`~wdsloader.io.ReadOptions`) sets retries, connect/read
    timeouts and the per-request deadline of remote reads (the manifest's read too); the
    arguments ``storage_options``, ``cache_dir``, ``cache_limit_bytes`` and ``verify_checksum``
    set the fields of the same name (a ValueError when ``read_options`` sets one otherwise).

    An explicit option that would be unused is a ValueError naming it: a ``curriculum`` whose
    output is not in ``fields``; ``rank``/``world_size`` with ``distributed=True``;
    ``device_mesh`` with any of those, or ``dp_dim`` without ``device_mesh``;
    ``persistent_workers``, ``prefetch_factor`` or ``multiprocessing_context`` with
    ``num_workers=0``; ``max_skipped`` with ``on_error="raise"``; ``cache_limit_bytes``
    without a cache directory.

    ``on_error="skip"`` skips samples that fail to read or decode (logged, counted in
    ``loader.stats``): a batch yields the samples that decoded; a batch whose every sample
    failed yields instead the samples of the worker's next batch that has any, so every rank
    still yields ``len(loader)`` batches and resume stays exact. More than ``max_skipped``
    skipped samples in one pass of a rank (None: no limit) raise
    :class:`~wdsloader.errors.SkipLimitError`. A worker process that dies raises
    :class:`~wdsloader.errors.WorkerDiedError` (a RuntimeError).

    A list of :class:`~wdsloader.mix.MixSource` mixes their ``split`` inside every batch: each
    source gives exactly its quota per epoch (``MixSource(weight=)``, ``samples=`` or ``repeat=``;
    largest remainder over ``epoch_samples``, default the sum of the quotas), a short source
    repeating and a large one subsampled in rotation (every sample before any twice, across
    epochs and weight changes). ``weights`` (a schedule: ``wdsloader.curriculum.fixed``,
    ``linear``, ``cosine``, ``steps``, ``from_callable``, keyed by source name) gives the
    weighted sources new weights each epoch. ``batching="mixed"`` (default) shuffles the
    sources together (elastic resume as for one source); ``"stratified"`` gives every global
    batch each source's exact share (resumes on the same topology only). ``source_field``
    names a batch field holding each sample's source index (in list order; off by default);
    ``loader.stats`` counts ``samples/<name>``. The sources must agree on the requested
    ``fields`` (dtype, shape): a ValueError names the sources, the field and both specs.
    These four options with a single dataset are a ValueError.
    """
    options = resolve_read_options(
        read_options,
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_limit_bytes=cache_limit_bytes,
        verify_checksum=verify_checksum,
    )
    r, world = rank_and_world(distributed, rank, world_size, device_mesh, dp_dim)
    mix_options = {"weights": weights, "epoch_samples": epoch_samples,
                   "batching": batching, "source_field": source_field}  # fmt: skip
    store: ShardStore | MixStore
    mix: MixSpec | None = None
    if isinstance(dataset_dir, (str, os.PathLike)):
        unused = sorted(k for k, v in mix_options.items() if v is not None)
        if unused:
            raise ValueError(
                f"{unused} would be unused: they configure a mix (pass a list of MixSource)"
            )
        root = os.fspath(dataset_dir)
        store, manifest = open_dataset(root, options, check_shards, split)
    else:
        mix_options["batching"] = batching or "mixed"
        from wdsloader.mix.store import open_mix

        store, manifest, mix = open_mix(
            list(dataset_dir), split, fields, mix_options,
            lambda url: open_dataset(url, options, check_shards, split),
        )  # fmt: skip
        root = "+".join(mix.names)
    config = resolve_config(
        manifest, split, batch_size, rank=r, world_size=world, remote=not store.reads_locally,
        num_workers=num_workers, epoch=epoch, drop_last=drop_last, pin_memory=pin_memory,
        seed=seed, shuffle=shuffle, shuffle_window=shuffle_window, span=span, fields=fields,
        collate_fn=collate_fn, collate_options=collate_options, allow_pickle=allow_pickle,
        on_error=on_error, max_skipped=max_skipped, persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context,
        curriculum=curriculum, gather=gather, mix=mix,
    )  # fmt: skip
    loader = build_loader(config, build_dataset(config, manifest, store))
    log.info(
        "%s/%s rank %d/%d: %d batches of %d per epoch, %d samples repeated, %d left out",
        store.redact(root), split, r, world, len(loader), batch_size, loader.padding,
        loader.dropped,
    )  # fmt: skip
    return loader
