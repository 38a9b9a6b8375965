"""Measure how fast a dataset reads through :func:`wdsloader.create_loader` (``wdsloader bench``).

:func:`measure_loader` reads one epoch (or ``max_batches`` batches) of a split with the same
loader a training job would use, timed by :func:`wdsloader.training.profile_dataloader` (the one
implementation), and returns a :class:`BenchResult`; the ``wdsloader bench DATASET``
command (:mod:`wdsloader.cli.commands`) prints it. The suite that compares wdsloader with its peers is
``bench/run.py`` in the repository.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from wdsloader.format import ShardInfo
from wdsloader.training.profile import batch_size_of

__all__ = ["BenchResult", "batch_size_of", "measure_ceiling", "measure_loader", "peak_rss_mb"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True, kw_only=True)
class BenchResult:
    """What :func:`measure_loader` measured.

    ``bytes`` is an estimate: the split's average bytes per sample in the manifest (shard bytes,
    tar headers included) times ``samples``. ``seconds`` runs from the ``create_loader`` call to
    the last batch, so ``samples_per_s`` and ``mb_per_s`` include start-up;
    ``time_to_first_batch_s`` is the part of it spent before the first batch.
    ``peak_rss_mb`` is this process's peak resident set size (``getrusage`` ``ru_maxrss``),
    DataLoader worker processes not included. For a remote dataset, ``tuning`` is what the
    main process's store chose (:class:`~wdsloader.io.tuning.Tuning` as a dict: request size,
    concurrency, read-ahead, measured round trip and rate; with workers, each worker measures
    and tunes its own) and ``ceiling_mb_per_s`` the path's ceiling
    (:func:`measure_ceiling`), else None.
    """

    samples: int
    batches: int
    bytes: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    time_to_first_batch_s: float | None
    peak_rss_mb: float | None
    tuning: dict[str, Any] | None = None
    ceiling_mb_per_s: float | None = None

    @property
    def ceiling_share(self) -> float | None:
        """``mb_per_s`` over the path's ceiling (None when not measured)."""
        if not self.ceiling_mb_per_s:
            return None
        return self.mb_per_s / self.ceiling_mb_per_s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def peak_rss_mb() -> float | None:
    """Peak resident set size of this process in MB (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB else


def measure_loader(
    dataset: str | os.PathLike[str],
    split: str = "train",
    *,
    batch_size: int = 256,
    num_workers: int = 0,
    max_batches: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    ceiling: bool = True,
    **loader_kwargs: Any,
) -> BenchResult:
    """Read ``split`` of ``dataset`` through ``create_loader`` and time it.

    Reads one epoch, or the first ``max_batches`` batches; ``loader_kwargs`` go to
    :func:`wdsloader.create_loader` (``seed``, ``shuffle``, ``decode``, ``read_options``, ...).
    ``progress=True`` shows a tqdm bar when stderr is a terminal. A remote dataset's
    ceiling is measured after the epoch unless ``ceiling=False``.
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1, got {max_batches}")
    from wdsloader.stream.loader import create_loader
    from wdsloader.training.profile import profile_dataloader

    t0 = time.perf_counter()
    loader = create_loader(
        dataset,
        split,
        batch_size=batch_size,
        num_workers=num_workers,
        storage_options=storage_options,
        **loader_kwargs,
    )
    startup = time.perf_counter() - t0
    info = loader.dataset_obj.manifest.split(split)
    avg_bytes = info.num_bytes / max(1, info.num_samples)
    total = len(loader) if max_batches is None else min(max_batches, len(loader))
    profile = profile_dataloader(loader, num_batches=max(1, total), progress=progress)
    seconds = startup + profile.seconds
    samples = profile.samples
    nbytes = round(avg_bytes * samples)
    ttfb = profile.time_to_first_batch_s
    result = BenchResult(
        samples=samples,
        batches=profile.batches,
        bytes=nbytes,
        seconds=seconds,
        samples_per_s=samples / seconds if seconds > 0 else 0.0,
        mb_per_s=nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        time_to_first_batch_s=None if ttfb is None else startup + ttfb,
        peak_rss_mb=peak_rss_mb(),
    )
    store = loader.dataset_obj.store
    if hasattr(store, "tuning") and not store.reads_locally:
        result.tuning = dataclasses.asdict(store.tuning())
        if ceiling:
            shards = [s for s in info.shards if s.num_bytes]
            result.ceiling_mb_per_s = measure_ceiling(
                dataset, shards, storage_options, max_bytes=max(nbytes, 1)
            )
    log.info(
        "%s/%s: %d samples in %.2f s (%.0f samples/s, %.1f MB/s), first batch after %s s",
        dataset,
        split,
        samples,
        seconds,
        result.samples_per_s,
        result.mb_per_s,
        "-" if result.time_to_first_batch_s is None else f"{result.time_to_first_batch_s:.3f}",
    )
    return result


CEILING_REQUEST_BYTES = 16 * 2**20
CEILING_CONCURRENCY = 16


def measure_ceiling(
    dataset: str | os.PathLike[str],
    shards: Sequence[ShardInfo],
    storage_options: dict[str, Any] | None,
    *,
    max_bytes: int,
) -> float:
    """The path's ceiling in MB/s: the first ``max_bytes`` of ``shards`` (whole shards, at
    least one) read as parallel ranged GETs of 16 MiB, 16 in flight, with nothing decoded."""
    from wdsloader.io import ReadOptions, ShardStore

    options = ReadOptions(
        storage_options=storage_options,
        max_request_bytes=CEILING_REQUEST_BYTES,
        concurrency=CEILING_CONCURRENCY,
    )
    todo, total = [], 0
    for shard in shards:
        if total >= max_bytes:
            break
        todo.append((shard, 0, shard.num_bytes))
        total += shard.num_bytes
    with ShardStore(dataset, options) as store:
        t0 = time.perf_counter()
        got = sum(len(b) for b in store.read_ranges(todo))
        seconds = time.perf_counter() - t0
    return got / seconds / 1e6 if seconds > 0 else 0.0
