"""The row decoder: a batch parsed and decoded one sample at a time (any tar flavour; errors name
the shard, the sample and the field)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from wdsloader.decode.batch import RawBatch
from wdsloader.decode.codecs import SampleDecoder, parse_sample
from wdsloader.decode.variants import Variants
from wdsloader.errors import WdsLoaderError


class RowDecoder:
    """Parses each sample of a :class:`RawBatch` (:func:`parse_sample`), decodes its requested
    fields (``decoder``) and adds the curriculum's output (``variants``, or None).

    ``sources`` names each shard (by its index in the split) in errors.
    """

    def __init__(
        self, decoder: SampleDecoder, sources: Sequence[str], variants: Variants | None
    ) -> None:
        self.decoder = decoder
        self.sources = list(sources)
        self.variants = variants

    def decode(
        self, raw: RawBatch, epoch: int, forced: int | None
    ) -> Iterator[tuple[int, dict[str, Any] | WdsLoaderError]]:
        """Per sample ``j`` in order: ``(j, sample)``, or ``(j, error)`` when the sample's range
        could not be read, parsed or decoded (the caller raises or skips it). Lazy: a caller
        that raises at the first error decodes no further sample."""
        for j in range(len(raw.start)):
            try:
                sample = self.decode_one(raw, j, epoch, forced)
            except WdsLoaderError as exc:
                yield j, exc
                continue
            yield j, sample

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
