"""How much work a build is before it starts: the cost of one item, measured on a few items
after the first, so that the local engine runs a small build in this process (starting worker
processes costs more than a small build takes: see :data:`build_shards.engines.local.SMALL_BUILD_S`).

The estimate only chooses how many processes run the blocks; the shards never depend on it.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from typing import Any

from build_shards.errors import BuildError
from build_shards.sources import Source
from build_shards.write.blocks import BlockJob, prepare
from wdsloader.errors import SchemaError
from wdsloader.format import TarStreamWriter

MEASURED_ITEMS = 16  # items timed after the first (which pays one-time costs: imports, caches)
MEASURE_BUDGET_S = 0.2  # no item is started once the measurement took this long


class _Discard:
    """A file object that drops what is written (the tar writer still builds and hashes it)."""

    def write(self, data: bytes) -> int:
        return len(data)


def item_seconds(
    job: BlockJob, src: Source, stream: Iterator[tuple[int, Any]] | None
) -> tuple[float, Iterator[tuple[int, Any]] | None]:
    """The seconds an item costs (read, decode, ``map``, encode, tar): the median over up to
    :data:`MEASURED_ITEMS` items after the first (robust to a one-off pause), fewer once they
    took :data:`MEASURE_BUDGET_S`, and the stream with the items read put back.

    An item that fails ends the measurement: the build raises its error where it always does.
    """
    if stream is not None:
        head = list(itertools.islice(stream, 1 + MEASURED_ITEMS))
        stream = itertools.chain(head, stream)
        items: Iterator[tuple[int, Any]] = iter(head[1:])
    else:
        assert src.length is not None
        items = src.iter_range(min(1, src.length), min(src.length, 1 + MEASURED_ITEMS))
    writer = TarStreamWriter(_Discard())  # type: ignore[arg-type]
    times: list[float] = []
    clock = time.perf_counter
    try:
        t0 = clock()
        for index, raw in items:  # the read of an indexable source's item is timed too
            prepared = prepare(job, index, raw)
            if prepared is not None:
                key, _split, sample = prepared
                members, _ = job.encoder.encode(key, sample)
                writer.write_sample(key, members)
            t1 = clock()
            times.append(t1 - t0)
            t0 = t1
            if sum(times) >= MEASURE_BUDGET_S:  # a costly map: a few items tell enough
                break
    except (BuildError, SchemaError, ValueError):
        pass
    return (statistics.median(times) if times else 0.0), stream
