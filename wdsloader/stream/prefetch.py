"""``DevicePrefetcher``: the next batch copied to the device while the current one trains."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from wdsloader.stream.device_images import (
    DeviceImageDecoder,
    device_image_decoder,
    encoded_files,
    stacked,
)


class DevicePrefetcher:
    """Iterate ``loader`` with the next batch already on ``device``.

    On CUDA the copy of batch k+1 (``non_blocking=True`` from pinned memory, on a side stream)
    overlaps the training step of batch k. On other devices it is a plain ``.to(device)``.

    ``images``: fields of a loader made with ``DecodeOptions(images="encoded")`` that hold
    encoded images; each batch's are decoded here by ``image_decoder`` (a name registered in
    :mod:`wdsloader.stream.device_images` or a callable; ``"auto"``: nvJPEG on CUDA where
    torchvision imports, else the CPU), on the side stream on CUDA, into ``uint8`` HWC tensors
    on ``device``: one ``(B, H, W, C)`` tensor when a batch's images share a shape.
    """

    def __init__(
        self,
        loader: Any,
        device: str | torch.device,
        images: Sequence[str] = (),
        image_decoder: str | DeviceImageDecoder = "auto",
    ) -> None:
        if isinstance(images, str):
            raise TypeError(f"images must be a sequence of field names, not the string {images!r}")
        self.loader = loader
        self.device = torch.device(device)
        self.images = tuple(images)
        self._decode = device_image_decoder(image_decoder, self.device) if self.images else None

    def __len__(self) -> int:
        return len(self.loader)

    def _move(self, batch: Any) -> Any:
        """``batch`` on the device, its ``images`` fields decoded there."""
        if self._decode is None:
            return self._to(batch)
        if not isinstance(batch, dict):
            raise TypeError(
                f"DevicePrefetcher(images={list(self.images)}) needs batches that are dicts of "
                f"fields, got a {type(batch).__name__}"
            )
        missing = [f for f in self.images if f not in batch]
        if missing:
            raise KeyError(
                f"DevicePrefetcher(images={list(self.images)}): the batch has no field "
                f"{missing[0]!r} (its fields: {sorted(batch)})"
            )
        out = {}
        for name, value in batch.items():
            if name in self.images:
                out[name] = stacked(self._decode(encoded_files(value, name), self.device))
            else:
                out[name] = self._to(value)
        return out

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
                yield self._move(batch)
            return
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)
        nxt = None
        try:
            first = next(it)
        except StopIteration:
            return
        with torch.cuda.stream(stream):
            nxt = self._move(first)
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current = nxt
            _record(current, torch.cuda.current_stream(self.device))
            try:
                upcoming = next(it)
                with torch.cuda.stream(stream):
                    nxt = self._move(upcoming)
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
