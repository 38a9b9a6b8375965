"""Pack tokenized documents into one stream cut into chunks of ``seq_length + 1`` tokens."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from build_shards.text.tokens import document_separators, encode_batch, token_dtype, vocab_size

# the text builder's log: one name for its modules
logger = logging.getLogger("build_shards.text")

_ENCODE_BATCH = 256


@dataclass(slots=True, kw_only=True)
class PackStats:
    """What :func:`pack_tokens` consumed and produced (filled in while it runs)."""

    documents: int = 0
    tokens: int = 0
    chunks: int = 0
    dropped_tail_tokens: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    dtype: str = ""


def check_lengths(seq_length: int, stride: int | None) -> int:
    if not isinstance(seq_length, int) or isinstance(seq_length, bool) or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")
    stride = seq_length if stride is None else stride
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    return stride


def _separators(
    tokenizer: Any, add_special_tokens: bool, bos_id: int | None, eos_id: int | None
) -> tuple[int | None, int | None]:
    """``(bos, eos)`` put around each document; only EOS when both are the same token."""
    if not add_special_tokens:
        return None, None
    bos, eos = document_separators(tokenizer, bos_id=bos_id, eos_id=eos_id)
    if bos is not None and bos == eos:
        bos = None
    return bos, eos


def token_setup(
    tokenizer: Any,
    stats: PackStats,
    *,
    add_special_tokens: bool,
    dtype: Any,
    bos_id: int | None,
    eos_id: int | None,
) -> tuple[np.dtype[Any], int, list[int], list[int]]:
    """The token dtype (``dtype`` or the vocabulary's :func:`token_dtype`; an integer type, else
    ValueError), its largest id, and the ids put before and after each document (recorded in
    ``stats``)."""
    bos, eos = _separators(tokenizer, add_special_tokens, bos_id, eos_id)
    out_dtype = np.dtype(dtype) if dtype is not None else token_dtype(vocab_size(tokenizer))
    if out_dtype.kind not in "iu":
        raise ValueError(f"dtype must be an integer type, got {out_dtype}")
    stats.bos_id, stats.eos_id, stats.dtype = bos, eos, out_dtype.name
    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    return out_dtype, int(np.iinfo(out_dtype).max), head, tail


def pack_tokens(
    documents: Iterable[str],
    tokenizer: Any,
    *,
    seq_length: int,
    stride: int | None = None,
    add_special_tokens: bool = True,
    dtype: Any = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    stats: PackStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples ``{"__key__": chunk index, "tokens": array of seq_length + 1 ids}``.

    Every document is tokenized (a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or
    any object whose ``.encode(text)`` returns ids or has ``.ids``), wrapped in the separators
    (see :mod:`build_shards.text`) and appended to one stream. Chunk ``i`` is
    ``stream[i * stride : i * stride + seq_length + 1]``: with the default ``stride =
    seq_length`` consecutive chunks share exactly one token (the label of the last position);
    a smaller stride overlaps them more, a larger one skips tokens. The incomplete tail is
    dropped and logged with its token count. ``dtype`` defaults to :func:`token_dtype` of the
    vocabulary; an id that does not fit it raises ``ValueError``. ``stats``, if given, is
    updated as the stream is consumed.
    """
    stride = check_lengths(seq_length, stride)
    stats = PackStats() if stats is None else stats
    out_dtype, max_id, head, tail = token_setup(
        tokenizer, stats, add_special_tokens=add_special_tokens, dtype=dtype, bos_id=bos_id,
        eos_id=eos_id,
    )  # fmt: skip
    window = seq_length + 1

    buf = np.empty(0, dtype=out_dtype)
    pos = 0  # start of the next chunk, relative to buf (may lie beyond it when stride > window)
    consumed = 0  # stream offset of buf[0]
    last_end = 0  # stream offset just past the last emitted chunk
    it = iter(documents)
    while True:
        batch = list(itertools.islice(it, _ENCODE_BATCH))
        if not batch:
            break
        pieces = [head + ids + tail for ids in encode_batch(tokenizer, batch)]
        n = sum(len(p) for p in pieces)
        stats.documents += len(batch)
        if n == 0:
            continue
        new = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=n)
        lo, hi = int(new.min()), int(new.max())
        if lo < 0 or hi > max_id:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} does not fit dtype {out_dtype.name}")
        new = new.astype(out_dtype)
        stats.tokens += n
        if pos >= len(buf):
            consumed += len(buf)
            pos -= len(buf)
            buf = new
        else:
            consumed += pos
            buf = np.concatenate([buf[pos:], new])
            pos = 0
        while pos + window <= len(buf):
            yield {"__key__": f"{stats.chunks:010d}", "tokens": buf[pos : pos + window].copy()}
            stats.chunks += 1
            last_end = consumed + pos + window
            pos += stride
    stats.dropped_tail_tokens = stats.tokens - last_end
    logger.info(
        "packed %d documents (%d tokens) into %d chunks of %d tokens; dropped the incomplete "
        "tail: %d tokens",
        stats.documents,
        stats.tokens,
        stats.chunks,
        window,
        stats.dropped_tail_tokens,
    )
