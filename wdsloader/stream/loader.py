"""``create_loader``: a torch DataLoader over one split of a built dataset, with exact resume."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from wdsloader import plan
from wdsloader.collate.collators import get_collator
from wdsloader.decode.codecs import SampleDecoder
from wdsloader.errors import ManifestError, StateMismatchError, WorkerDiedError
from wdsloader.format import Manifest
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.stream.dataset import ShardStreamDataset
from wdsloader.stream.start_method import check_sendable
from wdsloader.stream.state import check_state, make_state, resume_from_dict
from wdsloader.stream.workers import WorkerWatch

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum

log = logging.getLogger(__name__)

# Defaults that trade shuffle quality against read sizes (see README "Shuffling").
SPAN_BYTES = 256 * 2**10  # bytes of consecutive samples kept together (one range read)
WINDOW_BYTES = 64 * 2**20  # raw bytes a worker shuffles within (and holds in memory)
MAX_WINDOW = 16384
MIN_SPANS = 4096
# Remote reads (object stores, HTTP) pay a round trip per range: fewer, larger spans.
REMOTE_SPAN_BYTES = 2 * 2**20
REMOTE_MIN_SPANS = 256


class WdsDataLoader(DataLoader):
    """A DataLoader whose batches are planned per rank and worker; see :func:`create_loader`.

    Adds ``dataset_obj`` (the :class:`ShardStreamDataset`), ``sampler_obj`` (None: the plan does
    the sampler's job), ``state_dict()``/``load_state_dict()`` (torchdata's StatefulDataLoader
    protocol) and ``stats``. ``len(loader)`` is the number of batches this rank yields in a
    full epoch; iterating a loader to the end moves it to the next epoch.
    """

    def __init__(self, dataset: ShardStreamDataset, **kwargs: Any) -> None:
        # batches are collated inside the workers; torch's default_convert would walk them again
        super().__init__(dataset, batch_size=None, collate_fn=_as_is, **kwargs)
        self.dataset_obj = dataset
        self.sampler_obj = None
        self._pending: tuple[int, plan.Resume] | None = None  # loaded, not yet started
        self._started_from: plan.Resume | None = None  # where the current iteration began
        self._yielded = 0  # batches yielded by the current iteration

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset_obj
        resume = None
        if self._pending is not None and self._pending[0] == ds.epoch:
            resume = self._pending[1]
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
    def state_dict(self) -> dict[str, Any]:
        """The position: epoch, batches this rank yielded in it, and the plan's parameters."""
        ds = self.dataset_obj
        if self._pending is not None:
            epoch, resume = self._pending
        else:
            epoch = ds.epoch
            resume = plan.next_resume(ds.config, self._started_from, self._yielded)
        return make_state(ds.split, epoch, ds.config, resume, ds.shards_digest)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields the batches that followed it.

        A different world size, worker count, batch size, drop_last or shuffle window re-plans
        the samples not yet consumed in that epoch over the new topology (each delivered once).
        """
        ds = self.dataset_obj
        check_state(state, ds.split, ds.config, ds.shards_digest)
        epoch = state["epoch"]
        try:
            resume = resume_from_dict(state["resume"], ds.config)
            plan.num_batches(ds.config, epoch=epoch, resume=resume)  # validates the resume point
        except ValueError as exc:
            raise StateMismatchError(f"the loader state's resume point is invalid: {exc}") from exc
        ds.set_epoch(epoch)
        trivial = resume.batches_done == 0 and resume.prior is None
        self._pending = None if trivial else (epoch, resume)
        self._started_from, self._yielded = None, 0

    @property
    def padding(self) -> int:
        """Samples repeated this epoch so every rank gets the same batches (drop_last=False)."""
        return plan.epoch_padding(self.dataset_obj.config, epoch=self.dataset_obj.epoch)

    @property
    def dropped(self) -> int:
        """Samples left out this epoch so every batch is full (drop_last=True)."""
        return plan.epoch_dropped(self.dataset_obj.config, epoch=self.dataset_obj.epoch)

    @property
    def stats(self) -> dict[str, int]:
        """Counters summed over workers: samples, batches, skipped_samples, skipped_batches
        (batches whose every sample failed, yielded with stand-in samples), gathered_batches."""
        return self.dataset_obj.control.counters()


def _as_is(batch: Any) -> Any:
    return batch


def set_epoch(loader: WdsDataLoader, epoch: int) -> None:
    """Make the next iteration of ``loader`` play ``epoch`` (shuffle order, curriculum), also
    inside persistent workers."""
    ds = getattr(loader, "dataset_obj", None)
    if not isinstance(ds, ShardStreamDataset):
        raise TypeError("set_epoch expects a loader made by wdsloader.create_loader")
    if loader._pending is not None and loader._pending[0] != epoch:
        loader._pending = None
    ds.set_epoch(epoch)


def _resolve_curriculum(
    curriculum: Curriculum | Mapping[str, Any] | bool | None, manifest: Manifest
) -> Curriculum | None:
    """The curriculum in force: the argument, else the manifest's default."""
    from wdsloader.curriculum.curriculum import Curriculum

    if curriculum is False:
        return None
    if curriculum is None or curriculum is True:
        stored = manifest.loader_defaults.get("curriculum")
        if stored is None:
            if curriculum is True:
                raise ValueError("curriculum=True but the manifest stores no curriculum")
            return None
        return Curriculum.from_dict(stored)
    if isinstance(curriculum, Curriculum):
        return curriculum
    if isinstance(curriculum, Mapping):
        return Curriculum.from_dict(curriculum)
    raise TypeError(f"curriculum must be a Curriculum, a dict, a bool or None, got {curriculum!r}")


def _rank_and_world(distributed: bool, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if distributed:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed=True needs an initialised torch.distributed process group "
                "(call torch.distributed.init_process_group first, e.g. under torchrun)"
            )
        return dist.get_rank(), dist.get_world_size()
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    return (rank or 0), (world_size or 1)


def default_span_window(
    num_samples: int, num_bytes: int, batch_size: int, *, remote: bool = False
) -> tuple[int, int]:
    """The ``span`` and ``shuffle_window`` (a whole number of batches) used when not given.

    A span holds about ``SPAN_BYTES`` of samples, but the split keeps at least ``MIN_SPANS``
    spans when it can (the rank correlation between source and stream order shrinks like one
    over the square root of the number of spans); a window holds about ``WINDOW_BYTES``. Read
    remotely (no local cache), a span holds about ``REMOTE_SPAN_BYTES`` and at least
    ``REMOTE_MIN_SPANS`` spans are kept: each range read costs a round trip.
    """
    avg = max(1, num_bytes // max(1, num_samples))
    if remote:
        span_bytes, min_spans = REMOTE_SPAN_BYTES, REMOTE_MIN_SPANS
    else:
        span_bytes, min_spans = SPAN_BYTES, MIN_SPANS
    span = max(1, min(4096, round(span_bytes / avg), num_samples // min_spans))
    window = max(batch_size, min(MAX_WINDOW, WINDOW_BYTES // avg))
    return span, -(-window // batch_size) * batch_size


def create_loader(
    dataset_dir: str | os.PathLike[str],
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
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit_bytes: int | None = None,
    allow_pickle: bool = False,
    on_error: str = "raise",
    verify_checksum: bool = False,
    check_shards: bool = True,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    read_options: ReadOptions | None = None,
    multiprocessing_context: Any = None,
    curriculum: Curriculum | Mapping[str, Any] | bool | None = None,
    gather: bool = True,
    max_skipped: int | None = None,
) -> WdsDataLoader:
    """A DataLoader over ``split`` of the dataset at ``dataset_dir`` (a path or fsspec URL).

    Every rank yields exactly ``len(loader)`` batches; across ranks and workers each sample comes
    once per epoch (``drop_last=True`` drops fewer than ``world_size * batch_size``;
    ``drop_last=False`` repeats as few samples as needed to make ranks equal). ``drop_last``
    defaults to True for ``train`` and False otherwise; shuffling to ``train`` only.

    ``span`` (samples read together from one shard) and ``shuffle_window`` (samples a worker
    shuffles among) default to sizes derived from the average sample size (256 KiB and 64 MiB
    of data). ``fields`` limits decoding to those fields. ``collate_fn`` is a callable or the
    name of a registered collator (default: the manifest's ``loader_defaults["collate"]`` or
    ``"default"``). ``distributed=True`` takes rank and world size from ``torch.distributed``;
    ``rank``/``world_size`` set them explicitly. ``pin_memory`` takes effect only with CUDA.

    ``curriculum`` (a :class:`~wdsloader.curriculum.Curriculum` or its dict) replaces the stored
    variant fields by one output field drawn per sample and epoch; None uses the manifest's
    default (``loader_defaults["curriculum"]``), False none. ``gather=False`` turns off the
    whole-batch read of fixed-size fields (every sample is then parsed on its own).

    ``multiprocessing_context`` (``"fork"``, ``"spawn"``, ``"forkserver"`` or a context) picks
    how workers start; under spawn/forkserver a collator, decoder or schedule that cannot be
    pickled (a lambda, a closure) is a ValueError here, naming it.

    ``read_options`` (a :class:`~wdsloader.io.ReadOptions`) sets retries, connect/read
    timeouts and the per-request deadline of remote reads (the manifest's read too); the
    arguments ``storage_options``, ``cache_dir``, ``cache_limit_bytes`` and ``verify_checksum``
    override its fields.

    ``on_error="skip"`` skips samples that fail to read or decode (logged, counted in
    ``loader.stats``): a batch yields the samples that decoded; a batch whose every sample
    failed yields instead the samples of the worker's next batch that has any, so every rank
    still yields ``len(loader)`` batches and resume stays exact. More than ``max_skipped``
    skipped samples in one pass of a rank (None: no limit) raise
    :class:`~wdsloader.errors.SkipLimitError`. A worker process that dies raises
    :class:`~wdsloader.errors.WorkerDiedError` (a RuntimeError).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    options = dataclasses.replace(read_options or ReadOptions())
    options.storage_options = storage_options or options.storage_options
    if cache_dir is not None:
        options.cache_dir = cache_dir
        options.cache_limit_bytes = cache_limit_bytes
    options.verify_checksum = verify_checksum or options.verify_checksum
    root = os.fspath(dataset_dir)
    store = ShardStore(root, options)
    try:
        manifest = Manifest.load(root, options.storage_options_for(root))  # under its timeouts
    except ManifestError as exc:  # its message shows the root as given, userinfo included
        raise ManifestError(store.redact(exc)) from None
    split_info = manifest.split(split)
    if check_shards:
        store.check_shards(split_info.shards)
    is_train = split == "train"
    r, world = _rank_and_world(distributed, rank, world_size)
    auto_span, auto_window = default_span_window(
        split_info.num_samples,
        split_info.num_bytes,
        batch_size,
        remote=not store.reads_locally,
    )
    window = shuffle_window if shuffle_window is not None else auto_window
    config = plan.PlanConfig(
        counts=tuple(s.num_samples for s in split_info.shards),
        batch_size=batch_size,
        world_size=world,
        num_workers=max(1, num_workers),
        seed=seed,
        shuffle=is_train if shuffle is None else shuffle,
        drop_last=is_train if drop_last is None else drop_last,
        span=span if span is not None else auto_span,
        window=window,
    )
    collate_name = collate_fn if collate_fn is not None else manifest.loader_defaults.get("collate")
    collate = collate_name if callable(collate_name) else get_collator(collate_name)
    curr = _resolve_curriculum(curriculum, manifest)
    if isinstance(fields, str):
        raise TypeError(f"fields must be a sequence of field names, not the string {fields!r}")
    plain = None if fields is None else list(fields)
    if curr is not None:
        outputs = {curr.output, curr.index_output} - {None}
        if plain is None:
            plain = [f for f in manifest.schema if f not in curr.fields]
        elif curr.output in plain:
            plain = [f for f in plain if f not in outputs]
        else:
            curr = None  # the caller did not ask for the curriculum output
    dataset = ShardStreamDataset(
        manifest=manifest,
        split=split,
        store=store,
        config=config,
        rank=r,
        decoder=SampleDecoder(manifest.schema or None, plain, allow_pickle=allow_pickle),
        collate_fn=collate,
        on_error=on_error,
        readahead_batches=max(1, window // batch_size),
        curriculum=curr,
        gather=gather,
        max_skipped=max_skipped,
    )
    dataset.set_epoch(epoch)
    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": bool(pin_memory and torch.cuda.is_available()),
    }
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        kwargs["prefetch_factor"] = prefetch_factor or 2
        kwargs["multiprocessing_context"] = multiprocessing_context
        check_sendable(dataset, multiprocessing_context)
    elif persistent_workers or prefetch_factor:
        raise ValueError("persistent_workers and prefetch_factor need num_workers > 0")
    loader = WdsDataLoader(dataset, **kwargs)
    log.info(
        "%s/%s rank %d/%d: %d batches of %d per epoch, %d samples repeated, %d left out",
        store.redact(root),
        split,
        r,
        world,
        len(loader),
        batch_size,
        loader.padding,
        loader.dropped,
    )
    return loader


class DevicePrefetcher:
    """Iterate ``loader`` with the next batch already on ``device``.

    On CUDA the copy of batch k+1 (``non_blocking=True`` from pinned memory, on a side stream)
    overlaps the training step of batch k. On other devices it is a plain ``.to(device)``.
    """

    def __init__(self, loader: Any, device: str | torch.device) -> None:
        self.loader = loader
        self.device = torch.device(device)

    def __len__(self) -> int:
        return len(self.loader)

    def _to(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, dict):
            return {k: self._to(v) for k, v in batch.items()}
        if isinstance(batch, list | tuple) and batch and isinstance(batch[0], torch.Tensor):
            return type(batch)(self._to(v) for v in batch)
        return batch

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self._to(batch)
            return
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        nxt = None
        try:
            first = next(it)
        except StopIteration:
            return
        with torch.cuda.stream(stream):
            nxt = self._to(first)
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current = nxt
            _record(current, torch.cuda.current_stream(self.device))
            try:
                upcoming = next(it)
                with torch.cuda.stream(stream):
                    nxt = self._to(upcoming)
            except StopIteration:
                nxt = None
            yield current


def _record(batch: Any, stream: Any) -> None:
    """Tell the caching allocator that ``batch``'s tensors are used on ``stream``."""
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record(v, stream)
    elif isinstance(batch, list | tuple):
        for v in batch:
            _record(v, stream)
