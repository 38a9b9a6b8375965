"""Long fixed-size fields read straight into their batch arrays.

The shard layout fixes where a field's member data lies in each sample. For a field whose rows
are long (at least :data:`~wdsloader.decode.gather.LARGE_ROW` bytes), the batch reader sends
those bytes of every sample to the sample's row of a batch array (``os.preadv``: one copy, from
the page cache into the batch), and the rest of the samples (tar headers, ``.npy`` headers,
other members) to the read buffer as ever; an undeclared bytes field's member of each sample
is read into a ``bytes`` of its own (one copy, on the read thread), its value. The read buffer
keeps its layout, so every position
computed from it stays valid; only the placed bytes are missing there (a hole), until
:func:`restore` copies them back for a decoder that parses the samples.

The columnar decoder checks the placed fields exactly as the fields it gathers: every member
header (in the read buffer) named and checksummed, the ``.npy`` headers (in the read buffer)
equal to the schema's, before it hands out the rows (:func:`placed_values`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from wdsloader.decode.gather import LARGE_ROW, FieldTable, gather_rows
from wdsloader.io.buffers import BufferPool


@dataclass(frozen=True, slots=True)
class Placed:
    """The rows of one field of a batch, read into a batch array (or, for an undeclared bytes
    field, a list of ``bytes``): ``rows[j]`` holds the member data of sample ``j`` past any
    ``.npy`` header, bytes that belong at ``at[j]`` of the batch's read buffer (where they are
    missing until :func:`restore`)."""

    rows: np.ndarray | list[bytes]
    at: np.ndarray


@dataclass(frozen=True, slots=True)
class _Target:
    table: FieldTable
    skip: int  # bytes of the member before the placed data (its .npy header)
    count: int  # bytes placed per sample


class Placement:
    """Which fields the batch reader places, and the pool their batch arrays come from (a
    batch array returns to it once nothing refers to the batch, so a batch kept alive is never
    overwritten): the fields of ``tables`` whose rows are long. The rows of an undeclared bytes
    field (:attr:`FieldTable.as_bytes`) become ``bytes`` of their own (:meth:`as_bytes`)."""

    def __init__(self, tables: Mapping[str, FieldTable], pool: BufferPool) -> None:
        self.pool = pool
        self.targets: dict[str, _Target] = {}
        for name, table in tables.items():
            count = table.nbytes
            if not table.raw:
                count = int(np.prod(table.shape, dtype=np.int64)) * table.dtype.itemsize
            skip = table.nbytes - count
            if count >= LARGE_ROW and (skip == 0 if table.raw else skip >= 10):
                self.targets[name] = _Target(table, skip, count)

    def __bool__(self) -> bool:
        return bool(self.targets)

    def as_bytes(self, name: str) -> bool:
        """Whether field ``name``'s rows are read into ``bytes`` of their own (its plan's array
        then has no row: the read buffer has a hole there, nothing is read into it)."""
        return self.targets[name].table.as_bytes

    def plan(
        self, starts: np.ndarray, stops: np.ndarray, shard_idx: np.ndarray
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """For one batch (its samples' byte ranges in their shards): per placed field, a batch
        array ``(n, count)`` (``(0, count)`` for :meth:`as_bytes`) and the shard offset of each
        sample's bytes to read into it. A
        field is left out when a shard's layout does not fix it, or a sample is too short to
        hold it where the layout says (the decoder then finds out why)."""
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        n = len(starts)
        if n == 0:
            return out
        for name, target in self.targets.items():
            offsets = target.table.offsets[shard_idx]
            if (offsets < 0).any():
                continue
            data = starts + offsets + target.skip
            if (data + target.count > stops).any():
                continue
            if target.table.as_bytes:
                rows = np.empty((0, target.count), dtype=np.uint8)  # the reader's hole
            else:
                rows = self.pool.lease(n * target.count).reshape(n, target.count)
            out[name] = (rows, data)
        return out


def placed_values(
    table: FieldTable, buf: np.ndarray, positions: np.ndarray, rows: np.ndarray
) -> np.ndarray | None:
    """:meth:`FieldTable.gather` of placed rows: the member data of sample ``j`` begins at
    ``buf[positions[j]]`` with its ``.npy`` header (none for a raw field), the rest is
    ``rows[j]``. None when a ``.npy`` header differs from the first or from the schema."""
    n = len(positions)
    skip = table.nbytes - rows.shape[1]
    if n and skip:
        first = int(positions[0])
        span = table.data_span(buf[first : first + table.nbytes])
        if span != (skip, rows.shape[1]):
            return None
        headers = gather_rows(buf, positions, skip)
        if headers is None or not (headers == headers[0]).all():
            return None
    return rows.view(table.dtype).reshape(n, *table.shape)


def restore(buf: np.ndarray | None, placed: Mapping[str, Placed]) -> None:
    """Copy placed rows back to where they belong in the read buffer ``buf``, which then holds
    the samples' bytes whole (for a decoder that parses them)."""
    if buf is None:
        return
    for p in placed.values():
        for j, a in enumerate(p.at.tolist()):
            row = p.rows[j]
            count = len(row)
            buf[a : a + count] = (
                np.frombuffer(row, dtype=np.uint8) if isinstance(row, bytes) else row
            )
