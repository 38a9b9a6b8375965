"""A ``ray.data.Dataset`` as a source: rows by index range, for any Ray Data block layout.

The dataset is executed once, on the driver's Ray, with ``preserve_order=True`` (its own order of
rows: the order of its input files or items, kept through ``map``/``map_batches``/``filter`` and
a ``repartition`` without shuffle), and its blocks stay in Ray's object store as Arrow tables
(spilled to disk when larger than it). Row ``i`` is then the ``i``-th row of that order whatever
the blocks' sizes, so a task that reads rows ``[start, stop)`` fetches the blocks that hold them
and the shards do not depend on the block layout or the cluster's size. A dataset whose order
is not fixed (``random_shuffle`` without a seed) gives other shards each run, as a shuffled list
would. Rows are dicts of the dataset's columns (tensor columns as numpy arrays).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from build_shards.sources.base import Source


def _num_rows(table: Any) -> int:
    return int(table.num_rows)


class RayDataSource(Source):
    """A ``ray.data.Dataset``, read by row range (see the module's text)."""

    kind = "ray-data"
    length: int
    indexable = True

    def __init__(self, ds: Any) -> None:
        import ray

        context = ds.context.execution_options
        kept, context.preserve_order = context.preserve_order, True
        try:
            self._refs = list(ds.materialize().to_arrow_refs())
        finally:
            context.preserve_order = kept
        count = ray.remote(_num_rows).options(num_cpus=0)
        counts = ray.get([count.remote(ref) for ref in self._refs])
        self._starts = [0]
        for n in counts:
            self._starts.append(self._starts[-1] + n)
        self.length = self._starts[-1]
        self._columns = list(ds.schema().names) if ds.schema() is not None else []

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        import ray
        from ray.data.block import BlockAccessor

        stop = self.length if stop is None else min(stop, self.length)
        index = start
        b = bisect.bisect_right(self._starts, start) - 1
        while index < stop and b < len(self._refs):
            lo, hi = self._starts[b], self._starts[b + 1]
            if hi > index:
                table = BlockAccessor.for_block(ray.get(self._refs[b]))
                part = BlockAccessor.for_block(table.slice(index - lo, min(hi, stop) - lo))
                row: Any
                for row in part.iter_rows(public_row_format=True):
                    yield index, dict(row)
                    index += 1
            b += 1

    def describe(self) -> dict[str, Any]:
        """Kind, rows and columns: not the block layout, which does not change the shards."""
        return {"kind": self.kind, "length": self.length, "columns": self._columns}
