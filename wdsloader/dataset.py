"""The per-worker executor: turns the plan's sample ids into decoded, collated batches."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsloader import plan
from wdsloader.control import Control
from wdsloader.decode import SampleDecoder, parse_sample
from wdsloader.errors import WdsLoaderError
from wdsloader.fetch import ShardStore
from wdsloader.format import Manifest, ShardInfo
from wdsloader.state import resume_from_dict, resume_to_dict

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


@dataclass(slots=True, frozen=True)
class _Run:
    """A contiguous byte range of one shard holding one or more planned samples."""

    shard: int
    start: int
    stop: int


class ShardStreamDataset(IterableDataset):
    """An IterableDataset that yields whole batches of one split, planned by :mod:`wdsloader.plan`.

    Each DataLoader worker computes its own list of batches from the plan (no coordination),
    reads the byte ranges those samples occupy (coalesced, one group of batches ahead),
    decodes only the requested fields and collates inside the worker. ``len()`` is the number
    of batches this rank yields in a full epoch.
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
    ) -> None:
        super().__init__()
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if not 0 <= rank < config.world_size:
            raise ValueError(f"rank {rank} outside [0, {config.world_size})")
        self.manifest = manifest
        self.split = split
        self.shards: list[ShardInfo] = list(manifest.split(split).shards)
        self.store = store
        self.config = config
        self.rank = rank
        self.decoder = decoder
        self.collate_fn = collate_fn
        self.on_error = on_error
        self.readahead_batches = max(1, readahead_batches)
        self.control = Control(config.num_workers)

    # -- epoch / resume ------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays (also inside persistent workers)."""
        self.control.epoch = epoch

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

    def _iter_batches(self, batches: Sequence[np.ndarray], worker: int) -> Iterator[Any]:
        if not batches:
            return
        # the first batch is read on its own so it arrives quickly; then a window at a time
        group = self.readahead_batches
        groups = [batches[:1]] + [batches[i : i + group] for i in range(1, len(batches), group)]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdsloader-read") as pool:
            pending: Future = pool.submit(self._read_group, groups[0])
            for g in range(len(groups)):
                samples_by_batch = pending.result()
                if g + 1 < len(groups):
                    pending = pool.submit(self._read_group, groups[g + 1])
                for raw_samples in samples_by_batch:
                    batch = self._decode_batch(raw_samples, worker)
                    if batch is not None:
                        yield batch

    # -- reading -------------------------------------------------------------------------------
    def _read_group(self, batches: Sequence[np.ndarray]) -> list[list[Any]]:
        """Raw samples of a group of batches: per batch, per sample (bytes, start, stop, shard,
        local index) or an exception when the read failed and on_error is skip."""
        ids = np.concatenate(batches) if len(batches) > 1 else batches[0]
        shard_idx, local = plan.shard_of(ids, self.config.counts)
        starts = np.empty(len(ids), dtype=np.int64)
        stops = np.empty(len(ids), dtype=np.int64)
        for s in np.unique(shard_idx):
            mask = shard_idx == s
            offsets = self.store.index(self.shards[s])
            starts[mask] = offsets[local[mask]]
            stops[mask] = offsets[local[mask] + 1]
        runs, run_of = _coalesce(shard_idx, starts, stops)
        requests = [(self.shards[r.shard], r.start, r.stop) for r in runs]
        try:
            datas: list[Any] = self.store.read_ranges(requests)
        except (WdsLoaderError, OSError):
            if self.on_error == "raise":
                raise
            datas = []
            for req in requests:
                try:
                    datas.extend(self.store.read_ranges([req]))
                except (WdsLoaderError, OSError) as exc:
                    log.warning("skipping unreadable range: %s", exc)
                    datas.append(exc)
        out: list[list[Any]] = []
        pos = 0
        for batch in batches:
            items = []
            for j in range(pos, pos + len(batch)):
                run = runs[run_of[j]]
                items.append(
                    (datas[run_of[j]], starts[j] - run.start, stops[j] - run.start, run, local[j])
                )
            out.append(items)
            pos += len(batch)
        return out

    def _decode_batch(self, raw_samples: list[Any], worker: int) -> Any:
        samples: list[dict[str, Any]] = []
        for data, start, stop, run, local_index in raw_samples:
            shard = self.shards[run.shard]
            source = self.store.url(shard)
            try:
                if isinstance(data, Exception):
                    raise data
                key, raw = parse_sample(
                    data, int(start), int(stop), base_offset=run.start, source=source
                )
                sample = self.decoder(raw, key, source)
            except WdsLoaderError as exc:
                if self.on_error == "raise":
                    raise type(exc)(f"{exc} (sample #{local_index} of {source})") from exc
                log.warning("skipping sample #%d of %s: %s", local_index, source, exc)
                self.control.add(worker, "skipped_samples")
                continue
            samples.append(sample)
        self.control.add(worker, "samples", len(samples))
        if not samples:
            self.control.add(worker, "skipped_batches")
            return None
        self.control.add(worker, "batches")
        return self.collate_fn(samples)


def _coalesce(
    shard_idx: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> tuple[list[_Run], np.ndarray]:
    """Merge the byte ranges of samples that are adjacent (or repeated) in the same shard.

    Returns the runs and, for every sample, the index of the run that holds it.
    """
    order = np.lexsort((starts, shard_idx))
    s_shard, s_start, s_stop = shard_idx[order], starts[order], stops[order]
    new = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        same_shard = s_shard[1:] == s_shard[:-1]
        joined = (s_start[1:] == s_stop[:-1]) | (s_start[1:] == s_start[:-1])
        new[1:] = ~(same_shard & joined)
    run_id_sorted = np.cumsum(new) - 1
    run_of = np.empty(len(order), dtype=np.int64)
    run_of[order] = run_id_sorted
    firsts = np.flatnonzero(new)
    # a run ends at the largest stop among its members (repeats do not extend it)
    run_stops = np.maximum.reduceat(s_stop, firsts) if len(order) else s_stop
    runs = [
        _Run(int(s_shard[f]), int(s_start[f]), int(stop))
        for f, stop in zip(firsts, run_stops, strict=True)
    ]
    return runs, run_of
