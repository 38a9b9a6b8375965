"""Tokenized documents one sample each (``input_ids``: the document's ids with its separators),
for loaders that pack documents into rows themselves (``create_loader(packing=...)``): no
document is cut at a chunk boundary and none shares a row's attention with another."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from build_shards.text.pack import _ENCODE_BATCH, PackStats, logger, token_setup
from build_shards.text.tokens import encode_batch

__all__ = ["document_samples"]


def document_samples(
    documents: Iterable[str],
    tokenizer: Any,
    *,
    add_special_tokens: bool = True,
    dtype: Any = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    stats: PackStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples ``{"__key__": document index, "input_ids": its ids}``: each document tokenized
    and wrapped in the separators as :func:`~build_shards.text.pack_tokens` does (see
    :mod:`build_shards.text`); an empty one (no ids, no separators) is left out. ``stats``
    counts documents and tokens (``chunks``: the samples written)."""
    stats = PackStats() if stats is None else stats
    out_dtype, max_id, head, tail = token_setup(
        tokenizer, stats, add_special_tokens=add_special_tokens, dtype=dtype, bos_id=bos_id,
        eos_id=eos_id,
    )  # fmt: skip
    it = iter(documents)
    while batch := list(itertools.islice(it, _ENCODE_BATCH)):
        for ids in encode_batch(tokenizer, batch):
            stats.documents += 1
            row = np.asarray(head + ids + tail, dtype=np.int64)
            if not row.size:
                continue
            if int(row.min()) < 0 or int(row.max()) > max_id:
                bad = int(row.min()) if int(row.min()) < 0 else int(row.max())
                raise ValueError(f"token id {bad} does not fit dtype {out_dtype.name}")
            stats.tokens += row.size
            yield {"__key__": f"{stats.chunks:010d}", "input_ids": row.astype(out_dtype)}
            stats.chunks += 1
    logger.info("wrote %d documents (%d tokens), one sample each", stats.chunks, stats.tokens)
