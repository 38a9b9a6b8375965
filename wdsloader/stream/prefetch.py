"""``DevicePrefetcher``: the next batch copied to the device while the current one trains."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


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
