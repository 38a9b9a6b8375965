"""``Mix(unit="tokens")``: the sources' quotas in tokens, from the lengths their builds
recorded (:mod:`wdsloader.format.lengths`), planned by :mod:`wdsloader.plan.tokens`.

The quotas are those of a sample-weighted mix with each source's size counted in tokens
(its documents' lengths summed): ``weight=`` a largest-remainder share of ``epoch_tokens``
(default: the weighted sources' tokens summed), ``repeat=r`` ``floor(r * tokens)`` tokens,
weight schedules over epochs as for samples. ``samples=`` counts documents and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wdsloader.curriculum.schedule import Schedule
from wdsloader.errors import ShardFormatError
from wdsloader.format.checks import MAX_INT, as_int
from wdsloader.mix.source import MixSource, epoch_offsets_for, mix_names, mix_quotas_for
from wdsloader.plan.mix_stream import MixEpoch
from wdsloader.plan.tokens import TokenStream, token_mix_epoch
from wdsloader.redact import redact

__all__ = ["UNITS", "TokenPlan", "check_unit", "same_lengths_field", "source_lengths"]

#: What a mix's quotas count: samples (documents), or the tokens of their lengths field.
UNITS = ("samples", "tokens")


def check_unit(
    unit: str, sources: Sequence[MixSource], epoch_samples: int | None, epoch_tokens: int | None
) -> None:
    """ValueError for a ``unit`` not in :data:`UNITS` or options of the other unit."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {list(UNITS)}, got {unit!r}")
    if unit == "samples":
        if epoch_tokens is not None:
            raise ValueError('epoch_tokens counts tokens: give it with unit="tokens"')
        return
    if epoch_samples is not None:
        raise ValueError(
            'with unit="tokens" an epoch is counted in tokens: give epoch_tokens=, '
            "not epoch_samples="
        )
    if epoch_tokens is not None:
        as_int(epoch_tokens, "epoch_tokens", 1, MAX_INT)
    counted = [str(s.name) for s in sources if s.samples is not None]
    if counted:
        raise ValueError(
            f'sources {counted} have samples= (a number of documents) in a mix of unit="tokens": '
            "give them weight= or repeat= (repeat=1: every token once per epoch)"
        )


class TokenPlan:
    """The token side of a mix over ``sources`` whose documents have ``lengths`` (one array
    per source, by sample id in the split ``split``): token totals, token quotas and offsets
    per epoch, and the epochs in documents (:meth:`epoch`)."""

    def __init__(
        self,
        sources: Sequence[MixSource],
        lengths: Sequence[np.ndarray],
        *,
        weights: Schedule | None = None,
        epoch_tokens: int | None = None,
        split: str | None = None,
    ) -> None:
        names = mix_names(sources)
        if len(lengths) != len(sources):
            raise ValueError(f"{len(lengths)} length arrays for {len(sources)} sources")
        self.sources, self.names = tuple(sources), names
        self.lengths = tuple(np.asarray(x, dtype=np.uint32) for x in lengths)
        self.totals = tuple(int(x.sum(dtype=np.int64)) for x in self.lengths)
        self.weights, self.epoch_tokens, self.split = weights, epoch_tokens, split
        self.offsets = epoch_offsets_for(
            self.sources, self.totals, weights=weights, epoch_samples=epoch_tokens, split=split
        )
        self._streams: tuple[tuple[int, int], tuple[TokenStream, ...]] | None = None
        for epoch in sorted({0, *(weights.key_epochs() if weights is not None else ())}):
            self.quotas(epoch)  # the options' errors (weights, a source without tokens) at once

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_streams"} | {"_streams": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def quotas(self, epoch: int) -> tuple[int, ...]:
        """Each source's tokens in ``epoch``."""
        try:
            quotas = mix_quotas_for(
                self.sources, self.totals, epoch, weights=self.weights,
                epoch_samples=self.epoch_tokens, split=self.split,
            )  # fmt: skip
        except ValueError as exc:  # said in samples: the same rules, in tokens
            text = str(exc).replace("epoch_samples=", "epoch_tokens=")
            for said, meant in (
                ("samples the sources with", "tokens the sources with"),
                ("have no samples", "have no tokens (every length is 0)"),
                ("samples per epoch", "tokens per epoch"),
            ):
                text = text.replace(said, meant)
            raise ValueError(text) from None
        return quotas

    def streams(self, seed: int, block: int) -> tuple[TokenStream, ...]:
        """Each source's :class:`~wdsloader.plan.tokens.TokenStream` (the last kept)."""
        if self._streams is None or self._streams[0] != (seed, block):
            made = tuple(
                TokenStream(x, seed=seed, source=s, block=block) for s, x in enumerate(self.lengths)
            )
            self._streams = ((seed, block), made)
        return self._streams[1]

    def epoch(self, epoch: int, *, seed: int = 0, block: int = 1) -> MixEpoch:
        """The plan input of ``epoch`` in documents (see :mod:`wdsloader.plan.tokens`)."""
        epoch = as_int(epoch, "epoch", 0)
        return token_mix_epoch(
            self.streams(seed, block), self.quotas(epoch), self.offsets(epoch),
            seed=seed, epoch=epoch, block=block,
        )  # fmt: skip

    def epoch_tokens_of(self, me: MixEpoch) -> tuple[int, ...]:
        """The tokens each source's documents of ``me`` hold (its quota, within a document)."""
        streams = self.streams(me.seed, me.block)
        return tuple(
            st.tokens_before(o + q) - st.tokens_before(o)
            for st, o, q in zip(streams, me.offsets, me.quotas, strict=True)
        )


def source_lengths(
    name: str,
    url: str,
    shards: Sequence[Any],
    split: str,
    read: Callable[[Sequence[Any]], np.ndarray],
) -> np.ndarray:
    """Source ``name``'s documents' lengths in ``split`` (its ``shards``, read by ``read``);
    a ValueError naming the source and how to add them when a shard has none, the reader's
    ShardFormatError (a missing, truncated or changed file) prefixed by the source's name."""
    lacking = [s.path for s in shards if s.lengths_path is None]
    if lacking:
        raise ValueError(
            f'source {name!r}: a mix of unit="tokens" needs each document\'s length, and '
            f"{len(lacking)} of the {len(shards)} shards of split {split!r} have none (first: "
            f"{lacking[0]}); add them with `build-shards adopt {redact(url)} --lengths FIELD` "
            "(or build with SampleOptions(lengths=FIELD))"
        )
    try:
        return read(shards)
    except ShardFormatError as exc:
        raise ShardFormatError(f"source {name!r}: {exc}") from None


def same_lengths_field(names: Sequence[str], fields: Sequence[str | None]) -> None:
    """ValueError when the sources' lengths measure different fields."""
    if len(set(fields)) > 1:
        shown = dict(zip(names, fields, strict=True))
        raise ValueError(
            f'the sources of a mix of unit="tokens" measure their lengths on different fields '
            f"{shown}: rebuild them (build-shards adopt --lengths FIELD) on one field"
        )
