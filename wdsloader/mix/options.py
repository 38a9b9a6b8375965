"""``Mix``: several built datasets mixed sample by sample, as ``create_loader``'s source."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from wdsloader.curriculum.schedule import Schedule
from wdsloader.format.checks import as_int
from wdsloader.mix.source import MixSource, mix_names
from wdsloader.mix.tokens import check_unit
from wdsloader.plan.batching import get_batching_strategy

__all__ = ["Mix"]


@dataclass(frozen=True, slots=True)
class Mix:
    """``create_loader(Mix([...]), split, batch_size)`` mixes the ``split`` of every
    :class:`~wdsloader.mix.MixSource` inside every batch.

    Each source gives exactly its quota per epoch (``MixSource(weight=)``, ``samples=`` or
    ``repeat=``; largest remainder over ``epoch_samples``, default the sum of the quotas), a
    short source repeating and a large one subsampled in rotation (every sample before any
    twice, across epochs and weight changes). ``weights`` (a schedule:
    ``wdsloader.curriculum.fixed``, ``linear``, ``cosine``, ``steps``, ``from_callable``, keyed
    by source name) gives the weighted sources new weights each epoch. ``batching="mixed"``
    (default) shuffles the sources together (elastic resume as for one source);
    ``"stratified"`` gives every global batch each source's exact share (resumes on the same
    topology only); a strategy of one's own is registered with
    :func:`~wdsloader.plan.batching.register_batching_strategy`. ``source_field`` names a batch field holding each sample's source index
    (in list order; off by default). The sources must agree on the requested fields (dtype,
    shape): a ValueError names the sources, the field and both specs.

    ``unit="tokens"`` counts the quotas in tokens: each source's documents' lengths, as its
    build recorded them (``SampleOptions(lengths=FIELD)``, ``build-shards text``,
    ``build-shards adopt --lengths FIELD``); a weighted source's tokens per epoch are its share
    of ``epoch_tokens`` (default: the weighted sources' tokens summed) within one document,
    ``repeat=`` is of its tokens, ``samples=`` and ``epoch_samples`` are refused
    (:mod:`wdsloader.mix.tokens`).
    """

    sources: Sequence[MixSource]
    _: KW_ONLY
    weights: Schedule | None = None
    epoch_samples: int | None = None
    batching: str = "mixed"
    source_field: str | None = None
    unit: str = "samples"
    epoch_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        mix_names(self.sources)  # non-empty, every one a MixSource, names distinct
        get_batching_strategy(self.batching)  # a registered strategy (ValueError listing them)
        if self.weights is not None and not isinstance(self.weights, Schedule):
            raise TypeError(
                f"weights must be a schedule (wdsloader.curriculum.fixed, linear, cosine, steps, "
                f"from_callable), got {type(self.weights).__name__}"
            )
        if self.epoch_samples is not None:
            as_int(self.epoch_samples, "epoch_samples", 1)
        check_unit(self.unit, self.sources, self.epoch_samples, self.epoch_tokens)
        field = self.source_field
        if field is not None and (not isinstance(field, str) or not field):
            raise ValueError(f"source_field must be a non-empty string, got {field!r}")

    def spec_options(self) -> dict[str, Any]:
        """The mix options a :class:`~wdsloader.mix.MixSpec` takes besides the sources."""
        return {
            "weights": self.weights,
            "epoch_samples": self.epoch_samples,
            "batching": self.batching,
            "source_field": self.source_field,
            "unit": self.unit,
            "epoch_tokens": self.epoch_tokens,
        }
