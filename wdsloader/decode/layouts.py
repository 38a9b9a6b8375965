"""The layout groups of a columnar batch: shards whose samples the whole-batch path reads alike.

A shard's layout fixes where its gathered fields lie (the layout id of :func:`block_plan`) and
where the walk over its other members starts (:func:`wdsloader.decode.gather.walk_start`). A
batch whose samples come from shards of several such groups (shards of different builds, built
and adopted shards in one mix, a ``.cls`` first in some layouts only) is decoded one group at a
time (:func:`sub_batch`), each group with its own prefix gather, walk and template, and its
columns are put back in batch order (:func:`merge`): no batch leaves the whole-batch path
because its shards differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wdsloader.decode.batch import Columns, NotGatherable, RawBatch
from wdsloader.decode.gather import LARGE_ROW, FieldTable
from wdsloader.decode.placement import Placed
from wdsloader.errors import WdsLoaderError
from wdsloader.format.ustar import BLOCK

SMALL_BLOCK = 16 * 2**10  # sample prefixes up to this size are gathered in one piece


def block_plan(tables: Mapping[str, FieldTable], nshards: int) -> tuple[np.ndarray, np.ndarray]:
    """Per shard an id of the layout of its gathered fields ``tables`` (-1: a field has no
    fixed offset there), and per layout id the bytes of each sample to gather in one piece (0:
    gather field by field). Worth it when those bytes are few (``SMALL_BLOCK``) or the
    gathered fields fill at least half of them."""
    ids = np.full(nshards, -1, dtype=np.int64)
    if not tables:
        return ids, np.zeros(0, dtype=np.int64)
    seen: dict[tuple[int, ...], int] = {}
    for s in range(nshards):
        sig = tuple(int(t.offsets[s]) for t in tables.values())
        if min(sig) >= 0:
            ids[s] = seen.setdefault(sig, len(seen))
    lengths = np.zeros(len(seen), dtype=np.int64)
    if any(t.nbytes >= LARGE_ROW for t in tables.values()):
        return ids, lengths  # long rows are copied once each, straight into the batch
    for sig, layout in seen.items():
        needed = BLOCK  # the first header: keys
        length = BLOCK
        for offset, table in zip(sig, tables.values(), strict=True):
            length = max(length, offset + table.nbytes)
            needed += table.nbytes
        # (not the first variable header: the walk finds it, in one pass after the first batch)
        # one gather beats several when the rows are short or mostly wanted
        lengths[layout] = length if length <= SMALL_BLOCK or 2 * needed >= length else 0
    return ids, lengths


def layout_groups(layout_id: np.ndarray, walk_from: np.ndarray) -> np.ndarray:
    """Per shard the id of its group: shards with one layout of the gathered fields and one
    start of the walk over the other members."""
    pairs: dict[tuple[int, int], int] = {}
    out = np.empty(len(layout_id), dtype=np.int64)
    for s, pair in enumerate(zip(layout_id.tolist(), walk_from.tolist(), strict=True)):
        out[s] = pairs.setdefault(pair, len(pairs))
    return out


def sub_batch(raw: RawBatch, rows: np.ndarray) -> RawBatch:
    """The samples ``rows`` of ``raw`` as a batch of their own (the same read buffer)."""
    picked = rows.tolist()
    placed = {
        name: Placed(
            p.rows[rows] if isinstance(p.rows, np.ndarray) else [p.rows[j] for j in picked],
            p.at[rows],
        )
        for name, p in raw.placed.items()
    }
    return RawBatch(
        raw.buf,
        [raw.data[j] for j in picked],
        raw.start[rows],
        raw.stop[rows],
        raw.base[rows],
        raw.shard[rows],
        raw.local[rows],
        placed,
    )


def by_rows(
    raw: RawBatch,
    groups: Sequence[np.ndarray],
    decode: Callable[[RawBatch], Columns | NotGatherable],
) -> Columns | NotGatherable:
    """The batch ``raw`` decoded one group of its rows at a time (``groups``: the rows of
    each), by ``decode``, its columns put back in batch order; why a group cannot be, if one
    cannot."""
    parts = []
    for rows in groups:
        part = decode(sub_batch(raw, rows))
        if isinstance(part, NotGatherable):
            return part
        parts.append((rows, part))
    return merge(parts, len(raw))


def merge(parts: Sequence[tuple[np.ndarray, Columns]], n: int) -> Columns:
    """The columns of a batch of ``n`` samples from those of its groups (``(rows, columns)``):
    each column in batch order, an array when every group's is one of one dtype and row
    shape, else a list; the groups' errors under their batch rows."""
    columns: dict[str, Any] = {}
    for name in parts[0][1].columns:
        columns[name] = _column([(rows, cols.columns[name]) for rows, cols in parts], n)
    errors: dict[int, WdsLoaderError] = {}
    for rows, cols in parts:
        errors.update({int(rows[j]): exc for j, exc in cols.errors.items()})
    parsed = sum(cols.parsed for _, cols in parts)
    return Columns(columns, dict(sorted(errors.items())), parsed)


def _column(parts: Sequence[tuple[np.ndarray, Any]], n: int) -> Any:
    """One column of ``n`` rows from the groups' ``(rows, values)`` (an array's rows become
    the items of a list when the groups' values differ in kind, as the row decoder's are)."""
    first = parts[0][1]
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.dtype == first.dtype and v.shape[1:] == first.shape[1:]
        for _, v in parts
    ):
        out = np.empty((n, *first.shape[1:]), dtype=first.dtype)
        for rows, values in parts:
            out[rows] = values
        return out
    merged: list[Any] = [None] * n
    for rows, values in parts:
        for j, value in zip(rows.tolist(), values, strict=True):
            merged[j] = value
    return merged
