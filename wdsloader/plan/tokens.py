"""Token-weighted mixing (``Mix(unit="tokens")``): a source's quota in tokens turned into the
stream positions (documents) that carry them. Pure functions, no I/O.

A source's stream (:func:`~wdsloader.plan.mix_stream.source_ids`) cycles through one keyed
order of its documents; :class:`TokenStream` knows the tokens before every stream position.
Epoch ``e`` of a source covers the tokens ``[T(e), T(e + 1))`` of its stream, ``T(e)`` being
the sum of its token quotas over the earlier epochs (exact integers); it takes the documents
whose first token lies in that range (:meth:`TokenStream.position_at`). So an epoch's tokens
differ from its quota by less than one document (the one cut at either end is given wholly to
the epoch it starts in), the error never accumulates over epochs, and the epoch is an ordinary
:class:`~wdsloader.plan.mix_stream.MixEpoch` in documents: the batching strategies, the
rank and worker partition and the (elastic) resume are those of a sample-weighted mix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from wdsloader.format.checks import as_int
from wdsloader.plan.mix_stream import _SOURCE_TAG, MixEpoch, _key, source_ids

__all__ = ["TokenStream", "token_mix_epoch"]


class TokenStream:
    """The tokens along source ``source``'s stream under ``seed`` and ``block`` (as a mix plan
    of that seed and block reads it), from its documents' ``lengths`` (by sample id)."""

    def __init__(self, lengths: npt.ArrayLike, *, seed: int, source: int, block: int) -> None:
        lens = np.asarray(lengths)
        if lens.ndim != 1 or (lens.size and int(lens.min()) < 0):
            raise ValueError("lengths must be a 1-d array of counts >= 0")
        self.size = int(lens.size)
        order = source_ids(
            max(self.size, 1), as_int(block, "block", 1), _key(seed, source, _SOURCE_TAG),
            np.arange(self.size, dtype=np.int64),
        )  # fmt: skip
        cum = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(lens.astype(np.int64)[order], out=cum[1:])
        self._cum = cum
        self.total = int(cum[-1])  # the tokens of one pass over the source

    def tokens_before(self, position: int) -> int:
        """Tokens of the stream positions ``[0, position)``."""
        position = as_int(position, "position", 0)
        if self.size == 0:
            return 0
        cycles, rest = divmod(position, self.size)
        return cycles * self.total + int(self._cum[rest])

    def position_at(self, tokens: int) -> int:
        """The first stream position whose tokens before it reach ``tokens``: the documents
        before it hold the stream's first ``tokens`` tokens and less than one document more."""
        tokens = as_int(tokens, "tokens", 0)
        if tokens == 0:
            return 0
        if self.total == 0:
            raise ValueError(f"a stream without tokens cannot reach {tokens} tokens")
        cycles, rest = divmod(tokens, self.total)
        if rest == 0:  # the end of a pass, or earlier when the pass ends on empty documents
            cycles, rest = cycles - 1, self.total
        j = int(np.searchsorted(self._cum, rest, side="left"))
        return cycles * self.size + j


def token_mix_epoch(
    streams: Sequence[TokenStream],
    token_quotas: Sequence[int],
    token_offsets: Sequence[int],
    *,
    seed: int = 0,
    epoch: int = 0,
    block: int = 1,
) -> MixEpoch:
    """The epoch in documents of sources with ``streams`` (built with this ``seed`` and
    ``block``), each given ``token_quotas[i]`` tokens after the ``token_offsets[i]`` its
    earlier epochs took: per source the documents whose first token lies in
    ``[offset, offset + quota)`` of its stream."""
    n = len(streams)
    if len(token_quotas) != n or len(token_offsets) != n:
        raise ValueError(
            f"{len(token_quotas)} token quotas and {len(token_offsets)} offsets for {n} sources"
        )
    starts, quotas = [], []
    for s, (stream, q, o) in enumerate(zip(streams, token_quotas, token_offsets, strict=True)):
        q, o = as_int(q, f"token_quotas[{s}]", 0), as_int(o, f"token_offsets[{s}]", 0)
        a = stream.position_at(o)
        starts.append(a)
        quotas.append(stream.position_at(o + q) - a)
    return MixEpoch(
        sizes=tuple(s.size for s in streams), quotas=tuple(quotas), offsets=tuple(starts),
        seed=seed, epoch=epoch, block=block,
    )  # fmt: skip
