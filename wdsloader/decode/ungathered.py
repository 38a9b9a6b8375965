"""The fields a columnar batch does not gather: their members found by parsing each sample
(where one walk over the batch's headers cannot find them), and decoded field by field, a whole
column at once where the field's decoder has a batch form (:mod:`wdsloader.decode.fastcols`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeAlias

import numpy as np

from wdsloader.decode.batch import NotGatherable, RawBatch
from wdsloader.decode.fastcols import batch_decoder, bytes_column
from wdsloader.decode.parse import parse_sample
from wdsloader.decode.registry import SampleDecoder
from wdsloader.errors import WdsLoaderError
from wdsloader.io.buffers import BufferPool

# where the members of the fields that are not gathered lie: found by one walk over the
# batch's headers ({ext: (data positions, sizes)}), or per sample by parsing
Found: TypeAlias = dict[str, tuple[np.ndarray, np.ndarray]] | list[dict[str, memoryview]]


def parse_members(
    raw: RawBatch, keys: list[str], parse_from: np.ndarray, sources: Sequence[str]
) -> Found | NotGatherable:
    """The members of each sample from ``parse_from`` (per sample: where its constant-offset
    prefix ends), parsed one by one; ``sources`` names each shard."""
    joined = raw.data[0]
    out: list[dict[str, memoryview]] = []
    for j, key in enumerate(keys):
        start, stop = int(raw.start[j]), int(raw.stop[j])
        source = sources[raw.shard[j]]
        try:
            got, members = parse_sample(
                joined,
                start + int(parse_from[j]),
                stop,
                base_offset=int(raw.base[j]),
                source=source,
            )
        except WdsLoaderError:
            return NotGatherable(f"sample {key!r} of {source} does not parse")
        if got != key:
            return NotGatherable(f"sample {key!r} of {source} holds members of {got!r}")
        out.append(members)
    return out


def decode_fields(
    raw: RawBatch,
    keys: list[str],
    found: Found,
    fields: Sequence[str],
    decoder: SampleDecoder,
    sources: Sequence[str],
    errors: dict[int, WdsLoaderError],
    pool: BufferPool | None = None,
) -> dict[str, list[Any]]:
    """Decode ``fields`` (those not gathered) of the batch's samples from their members
    ``found``; a sample whose decoder raises gets its first field's error in ``errors`` (and
    None in the columns). ``pool``: where large ``uint8`` bytes columns are copied to."""
    out: dict[str, list[Any]] = {}
    if isinstance(found, list):
        for field in fields:
            values: list[Any] = []
            for j, (key, members) in enumerate(zip(keys, found, strict=True)):
                source = sources[raw.shard[j]]
                try:
                    values.append(decoder.decode_field(members, key, source, field))
                except WdsLoaderError as exc:
                    errors.setdefault(j, exc)
                    values.append(None)
            out[field] = values
        return out
    buf = raw.buf
    assert buf is not None
    view = memoryview(buf)  # type: ignore[arg-type]
    for field in fields:
        ext, fn = decoder.field_decoder(field)
        if ext not in found:  # an optional field no sample of the batch has
            out[field] = [None] * len(keys)
            continue
        positions, sizes = found[ext]
        column = batch_decoder(fn)
        if column is bytes_column:
            column = partial(bytes_column, pool=pool)
        whole = None if column is None else column(buf, positions, sizes)
        if whole is not None:  # every member read exactly as ``fn`` reads it
            out[field] = whole
            continue
        values, failed = _decode_column(fn, view, positions.tolist(), sizes.tolist())
        for j, err in failed.items():
            source = sources[raw.shard[j]]
            errors.setdefault(j, decoder.field_error(err, keys[j], source, field, ext))
        out[field] = values
    return out


def _decode_column(
    fn: Callable[[Any], Any], view: memoryview, positions: list[int], sizes: list[int]
) -> tuple[list[Any], dict[int, Exception]]:
    """``fn`` of each member ``view[p : p + n]``, and the exception of each one that raised
    (its value None)."""
    out: list[Any] = []
    failed: dict[int, Exception] = {}
    append = out.append
    todo = zip(positions, sizes, strict=True)
    while True:
        try:
            for p, n in todo:
                append(fn(view[p : p + n]))
            return out, failed
        except Exception as exc:  # the decoder's error becomes its sample's error, not a fallback
            failed[len(out)] = exc
            append(None)
