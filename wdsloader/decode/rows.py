"""The row decoder: a batch parsed and decoded one sample at a time (any tar flavour; errors name
the shard, the sample and the field)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from wdsloader.decode.batch import RawBatch
from wdsloader.decode.images import IMAGE_THREADS, is_image_decoder
from wdsloader.decode.parse import parse_sample
from wdsloader.decode.registry import SampleDecoder
from wdsloader.decode.variants import Variants
from wdsloader.errors import WdsLoaderError


class RowDecoder:
    """Parses each sample of a :class:`RawBatch` (:func:`parse_sample`), decodes its requested
    fields (``decoder``) and adds the curriculum's output (``variants``, or None).

    ``sources`` names each shard (by its index in the split) in errors. When the requested
    fields include an image decoded by the built-in decoder (or an ``ImageDecoder``), the samples of a batch are decoded
    on a pool of :data:`IMAGE_THREADS` threads of this process (made on first use, never
    pickled), in order as ever.
    """

    def __init__(
        self, decoder: SampleDecoder, sources: Sequence[str], variants: Variants | None
    ) -> None:
        self.decoder = decoder
        self.sources = list(sources)
        self.variants = variants
        self.threads = IMAGE_THREADS if decoder.decodes_any(is_image_decoder) else 0
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"], state["_pool_pid"] = None, 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def decode(
        self, raw: RawBatch, epoch: int, forced: int | None
    ) -> Iterator[tuple[int, dict[str, Any] | WdsLoaderError]]:
        """Per sample ``j`` in order: ``(j, sample)``, or ``(j, error)`` when the sample's range
        could not be read, parsed or decoded (the caller raises or skips it). Lazy (without
        threads): a caller that raises at the first error decodes no further sample."""
        n = len(raw.start)
        if self.threads and n > 1:
            pool = self._threads()
            results = pool.map(self._try_one, [raw] * n, range(n), [epoch] * n, [forced] * n)
            yield from enumerate(results)
            return
        for j in range(n):
            yield j, self._try_one(raw, j, epoch, forced)

    def _try_one(
        self, raw: RawBatch, j: int, epoch: int, forced: int | None
    ) -> dict[str, Any] | WdsLoaderError:
        try:
            return self.decode_one(raw, j, epoch, forced)
        except WdsLoaderError as exc:
            return exc

    def _threads(self) -> ThreadPoolExecutor:
        """This process's decode pool (a forked worker makes its own)."""
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="wdsloader-decode")
            self._pool_pid = os.getpid()
        return self._pool

    def decode_one(self, raw: RawBatch, j: int, epoch: int, forced: int | None) -> dict[str, Any]:
        """Sample ``j`` of ``raw`` decoded; raises a :class:`WdsLoaderError` naming it."""
        data = raw.data[j]
        if isinstance(data, Exception):
            raise data
        source = self.sources[raw.shard[j]]
        key, members = parse_sample(
            data, int(raw.start[j]), int(raw.stop[j]), base_offset=int(raw.base[j]), source=source
        )
        sample = self.decoder(members, key, source)
        variants = self.variants
        if variants is not None:
            curriculum = variants.curriculum
            variant = int(variants.draw([key], epoch, forced)[0])
            name = curriculum.field_of(variant)
            value = (
                variants.zero.copy()
                if name is None
                else self.decoder.decode_field(members, key, source, name)
            )
            sample[curriculum.output] = value
            if curriculum.index_output:
                sample[curriculum.index_output] = np.int64(variant)
        return sample
