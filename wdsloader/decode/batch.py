"""A batch as the decoders see it: its read bytes (:class:`RawBatch`, from the batch reader),
and what the columnar decoder makes of them (:class:`Columns`, or :class:`NotGatherable`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.errors import WdsLoaderError

if TYPE_CHECKING:
    from wdsloader.decode.placement import Placed


@dataclass(slots=True)
class RawBatch:
    """The read bytes of one batch: sample ``j`` is ``data[j][start[j]:stop[j]]`` of shard
    ``shard[j]`` (its ``local[j]``-th sample); ``base[j]`` turns a position in ``data[j]`` into a
    byte offset in the shard. ``buf`` is the one uint8 buffer all samples lie in (None when a
    read failed and ``data`` holds the exception of each unreadable range). ``placed``: the
    fields the reader read straight into batch arrays, whose bytes ``buf`` lacks until
    :func:`wdsloader.decode.placement.restore`."""

    buf: np.ndarray | None
    data: list[Any]
    start: np.ndarray
    stop: np.ndarray
    base: np.ndarray
    shard: np.ndarray
    local: np.ndarray
    placed: dict[str, Placed] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start)


@dataclass(frozen=True, slots=True)
class NotGatherable:
    """Why a batch cannot be decoded as columns; the row decoder decodes it."""

    reason: str


@dataclass(slots=True)
class Columns:
    """A batch as columns (``field -> (n, ...) array or list``, ``__key__`` first), and the
    samples whose decoding failed: ``errors[j]`` for row ``j`` (their list entries are None).
    ``parsed``: how many samples had their members found by parsing each one (no batch walk).
    """

    columns: dict[str, Any]
    errors: dict[int, WdsLoaderError] = dataclasses.field(default_factory=dict)
    parsed: int = 0

    def __len__(self) -> int:
        return len(self.columns["__key__"])

    def without(self, rows: Collection[int]) -> dict[str, Any]:
        """The columns without the rows ``rows``."""
        keep = np.ones(len(self), dtype=bool)
        keep[list(rows)] = False
        kept = np.flatnonzero(keep).tolist()
        return {
            name: values[keep] if isinstance(values, np.ndarray) else [values[j] for j in kept]
            for name, values in self.columns.items()
        }
