"""``profile_dataloader``: how fast a loader feeds a training step, and how long the step waits.

One implementation for training code and for ``wdsloader bench``. It reads up to ``num_batches``
batches, timing each wait for the next batch; with a ``step_fn`` (the training step, or a
simulated one) it also reports the share of wall time spent waiting for data. ``replay=True``
caches the first batches and replays them instead of loading: the speed the step would reach if
loading were free, the upper bound to compare with.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["ProfileResult", "batch_size_of", "profile_dataloader"]

REPLAY_BATCHES = 8


@dataclasses.dataclass(slots=True, kw_only=True)
class ProfileResult:
    """What :func:`profile_dataloader` measured.

    ``seconds`` runs from ``iter(loader)`` to the end of the last step (worker start-up
    included); ``time_to_first_batch_s`` is the part before the first batch arrived.
    ``wait_p50_s``/``wait_p95_s`` are percentiles of the wait for each batch after the first;
    ``wait_share`` (with a ``step_fn``; else None) is that waiting divided by the wall time after
    the first batch. ``replay`` marks a replayed run (no loading).
    """

    batches: int
    samples: int
    seconds: float
    samples_per_s: float
    batches_per_s: float
    time_to_first_batch_s: float | None
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_share: float | None
    replay: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line for logs and command lines."""
        parts = [
            f"{self.samples:,} samples in {self.batches:,} batches, {self.seconds:.2f} s",
            f"{self.samples_per_s:,.0f} samples/s",
            f"{self.batches_per_s:,.1f} batches/s",
        ]
        if self.time_to_first_batch_s is not None:
            parts.append(f"first batch {self.time_to_first_batch_s:.3f} s")
        if self.wait_p50_s is not None and self.wait_p95_s is not None:
            parts.append(
                f"wait p50 {self.wait_p50_s * 1e3:.2f} ms p95 {self.wait_p95_s * 1e3:.2f} ms"
            )
        if self.wait_share is not None:
            parts.append(f"waiting {self.wait_share:.1%} of the time")
        return ("replay: " if self.replay else "") + ", ".join(parts)


def batch_size_of(batch: Any) -> int:
    """The number of samples in a collated batch (dict, tuple/list or tensor)."""
    if isinstance(batch, dict):
        keys = batch.get("__key__")
        if isinstance(keys, list | tuple):
            return len(keys)
        values = list(batch.values())
    elif isinstance(batch, list | tuple):
        values = list(batch)
    else:
        values = [batch]
    for v in values:
        shape = getattr(v, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(v, list | tuple):
            return len(v)
    raise TypeError(f"cannot tell the number of samples in a batch of type {type(batch).__name__}")


def _to_device(batch: Any, device: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _synchronize(device: Any) -> None:
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _replayed(loader: Any, num_batches: int, device: Any) -> Iterator[Any]:
    """An iterator over ``num_batches`` batches cycling through the first ones of ``loader``
    (read, and moved to ``device``, before it is returned)."""
    cache = []
    it = iter(loader)
    for batch in it:
        cache.append(batch if device is None else _to_device(batch, device))
        if len(cache) >= min(num_batches, REPLAY_BATCHES):
            break
    del it  # shuts DataLoader workers down
    _synchronize(device)
    return (cache[i % len(cache)] for i in range(num_batches if cache else 0))


def profile_dataloader(
    loader: Any,
    num_batches: int = 100,
    step_fn: Callable[[Any], Any] | None = None,
    device: Any = None,
    replay: bool = False,
    *,
    progress: bool = False,
) -> ProfileResult:
    """Read up to ``num_batches`` batches of ``loader`` (fewer if it ends first) and time them.

    ``device``: each batch is moved there (``non_blocking`` from pinned memory) before the
    step; on CUDA the device is synchronized after each step, so the time is the device's.
    ``step_fn(batch)`` runs after each batch (its return value is ignored). ``replay=True``
    first reads the first batches (up to 8) and then times ``num_batches`` steps over them,
    cycling: the loading cost is left out. ``progress=True`` shows a tqdm bar on a terminal.
    """
    if not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be a positive integer, got {num_batches!r}")
    from wdsloader.progress import progress_bar

    source = _replayed(loader, num_batches, device) if replay else iter(loader)
    waits: list[float] = []
    samples = 0
    bar = progress_bar(total=num_batches, unit="batch", enabled=progress)
    t0 = time.perf_counter()
    t_first: float | None = None
    try:
        while len(waits) < num_batches:
            t = time.perf_counter()
            try:
                batch = next(source)
            except StopIteration:
                break
            if device is not None and not replay:
                batch = _to_device(batch, device)
            now = time.perf_counter()
            waits.append(now - t)
            if t_first is None:
                t_first = now
            samples += batch_size_of(batch)
            if step_fn is not None:
                step_fn(batch)
            _synchronize(device)
            bar.update(1)
    finally:
        t_end = time.perf_counter()
        bar.close()
        del source  # shuts DataLoader workers down when the loop stopped early
    return _result(waits, samples, t0, t_first, t_end, step_fn is not None, replay)


def _result(
    waits: list[float],
    samples: int,
    t0: float,
    t_first: float | None,
    t_end: float,
    with_step: bool,
    replay: bool,
) -> ProfileResult:
    seconds = t_end - t0
    steady = np.asarray(waits[1:])
    after_first = t_end - t_first if t_first is not None else 0.0
    return ProfileResult(
        batches=len(waits),
        samples=samples,
        seconds=seconds,
        samples_per_s=samples / seconds if seconds > 0 else 0.0,
        batches_per_s=len(waits) / seconds if seconds > 0 else 0.0,
        time_to_first_batch_s=None if t_first is None else t_first - t0,
        wait_p50_s=float(np.percentile(steady, 50)) if steady.size else None,
        wait_p95_s=float(np.percentile(steady, 95)) if steady.size else None,
        wait_share=(float(steady.sum() / after_first) if with_step and after_first > 0 else None),
        replay=replay,
    )
