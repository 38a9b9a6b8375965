"""``MixSource``: one built dataset in a mix, with its weight or its fixed number of samples per
epoch; and the mix's plan for an epoch (quotas, and where each source's stream stands).

A source takes exactly one of:

- ``weight=``: a share of the epoch (largest remainder over the weighted sources);
- ``samples=``: that many samples every epoch;
- ``repeat=``: ``floor(repeat * size)`` samples every epoch (``repeat=3`` sees each sample 3
  times, ``repeat=0.25`` a rotating quarter of it).

With none of them on any source, each source is seen once per epoch (``repeat=1``). Weights may
instead come from a schedule over epochs (``weights=`` of :func:`mix_epoch`: the curriculum's
:func:`~wdsloader.curriculum.fixed`, ``linear``, ``cosine``, ``steps`` or ``from_callable``,
keyed by source name), for the sources without ``samples``/``repeat``.
"""

from __future__ import annotations

import functools
import math
import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from wdsloader.curriculum.schedule import Schedule
from wdsloader.format.checks import MAX_INT, as_int
from wdsloader.lazy import moved_names
from wdsloader.mix.offsets import EpochOffsets
from wdsloader.plan.mix import MixEpoch
from wdsloader.plan.quotas import mix_quotas
from wdsloader.redact import redact

__all__ = ["MixSource", "epoch_offsets_for", "mix_epoch", "mix_names", "mix_quotas_for"]

# ``Source``: MixSource's old name, until 0.2.0 (``build_shards.Source`` is a build input).
__getattr__ = moved_names(__name__, {"Source": ("wdsloader.mix", "MixSource")})


@dataclass(frozen=True)
class MixSource:
    """A built dataset (a local path or fsspec URL) in a mix; see the module docstring.

    ``name`` (default: the last part of the path, never the URL's userinfo, query or
    fragment; the host when the path is empty) names the source in schedules, errors,
    ``stats``, the state's fingerprint and the optional source field of a batch. A name that
    carries credentials is refused.
    """

    url: str | os.PathLike[str]
    weight: float | None = None
    samples: int | None = None
    repeat: float | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", os.fspath(self.url))
        shown = redact(self.url)
        given = [k for k in ("weight", "samples", "repeat") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                f"MixSource {shown!r}: give one of weight=, samples= or repeat=, not {given}"
            )
        for key in ("weight", "repeat"):
            value = getattr(self, key)
            if value is not None:
                v = float(value)
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"MixSource {shown!r}: {key}={value!r} must be finite, >= 0")
                object.__setattr__(self, key, v)
        if self.samples is not None:
            object.__setattr__(
                self, "samples", as_int(self.samples, f"MixSource {shown!r}: samples", 0, MAX_INT)
            )
        if self.name is None:
            object.__setattr__(self, "name", default_name(str(self.url)))
        elif not isinstance(self.name, str) or not self.name:
            raise ValueError(f"MixSource {shown!r}: name must be a non-empty string")
        elif redact(self.name) != self.name:
            raise ValueError(
                f"MixSource {shown!r}: name {redact(self.name)!r} carries credentials; the name "
                "is shown in stats, states and errors: give another"
            )

    def __repr__(self) -> str:
        kept = [f"{k}={getattr(self, k)!r}" for k in ("weight", "samples", "repeat", "name")]
        return f"MixSource({redact(self.url)!r}, {', '.join(kept)})"

    def fixed_quota(self, size: int) -> int | None:
        """Samples per epoch from ``samples=``/``repeat=`` (None for a weighted source)."""
        if self.samples is not None:
            return self.samples
        if self.repeat is not None:
            return math.floor(Fraction(repr(self.repeat)) * size)
        return None


def default_name(url: str) -> str:
    """The default name of a source at ``url``: the last part of its path; for a URL without
    a path its host (and port). Never its userinfo, query string or fragment."""
    if "://" not in url:
        return url.rstrip("/").rsplit("/", 1)[-1] or url
    parts = urllib.parse.urlsplit(url)
    base = parts.path.rstrip("/").rsplit("/", 1)[-1]
    host = parts.netloc.rsplit("@", 1)[-1]
    return base or host or redact(url)


def mix_names(sources: Sequence[MixSource]) -> tuple[str, ...]:
    """The sources' names, checked unique."""
    if not sources or not all(isinstance(s, MixSource) for s in sources):
        raise ValueError("a mix needs a non-empty list of MixSource")
    names = tuple(str(s.name) for s in sources)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"sources share the names {dup}: give each a distinct name=")
    return names


def _weights(
    sources: Sequence[MixSource], names: tuple[str, ...], weights: Schedule | None, epoch: int
) -> list[float | None]:
    weighted = [i for i, s in enumerate(sources) if s.fixed_quota(0) is None]
    if weights is not None:
        given = [names[i] for i in weighted if sources[i].weight is not None]
        if given:
            raise ValueError(
                f"sources {given} have a weight= and the mix a weights schedule: use one"
            )
        probs = weights.probabilities(epoch, tuple(names[i] for i in weighted))
        out: list[float | None] = [None] * len(sources)
        for i, p in zip(weighted, probs.tolist(), strict=True):
            out[i] = p
        return out
    missing = [names[i] for i in weighted if sources[i].weight is None]
    if missing:
        raise ValueError(
            f"sources {missing} have no weight=, samples= or repeat= while others have one: "
            "give every source one (repeat=1 sees a source once per epoch)"
        )
    return [s.weight for s in sources]


def mix_quotas_for(
    sources: Sequence[MixSource],
    sizes: Sequence[int],
    epoch: int,
    *,
    weights: Schedule | None = None,
    epoch_samples: int | None = None,
    split: str | None = None,
) -> tuple[int, ...]:
    """Each source's samples in ``epoch`` (sizes: the sources' samples in the split, named
    ``split`` in errors)."""
    names = mix_names(sources)
    if len(sizes) != len(sources):
        raise ValueError(f"{len(sizes)} sizes for {len(sources)} sources")
    epoch = as_int(epoch, "epoch", 0)
    plain = weights is None and all(s.weight is None and s.fixed_quota(0) is None for s in sources)
    if plain:  # nothing given: each source once per epoch
        w: list[float | None] = [None] * len(sources)
        fixed: list[int | None] = [int(n) for n in sizes]
    else:
        w = _weights(sources, names, weights, epoch)
        fixed = [s.fixed_quota(int(n)) for s, n in zip(sources, sizes, strict=True)]
    quotas = mix_quotas(sizes, w, fixed, epoch_samples, names=names, split=split)
    return tuple(int(v) for v in quotas)


def epoch_offsets_for(
    sources: Sequence[MixSource],
    sizes: Sequence[int],
    *,
    weights: Schedule | None = None,
    epoch_samples: int | None = None,
    split: str | None = None,
) -> EpochOffsets:
    """Where each source's stream stands at an epoch's start (its earlier quotas summed): O(1)
    once the weights stop changing (at once for constant weights), kept sums before that."""
    quotas = functools.partial(
        mix_quotas_for, tuple(sources), tuple(sizes), weights=weights,
        epoch_samples=epoch_samples, split=split,
    )  # fmt: skip
    return EpochOffsets(quotas, 0 if weights is None else weights.steady_from())


def mix_epoch(
    sources: Sequence[MixSource],
    sizes: Sequence[int],
    epoch: int,
    *,
    seed: int = 0,
    block: int = 1,
    weights: Schedule | None = None,
    epoch_samples: int | None = None,
    offsets: EpochOffsets | None = None,
    split: str | None = None,
) -> MixEpoch:
    """The plan input of ``epoch``: its quotas, and the stream positions the earlier epochs
    consumed (their quotas summed), so a resume after a weight change neither replays nor skips.
    ``offsets`` (:func:`epoch_offsets_for` of the same arguments) keeps its sums from one call
    to the next; without it, an epoch past the schedule's end (or any, with constant weights)
    still costs O(sources), and one before it O(epoch * sources). ``split`` names the sizes'
    split in errors."""
    epoch = as_int(epoch, "epoch", 0)
    if offsets is None:
        offsets = epoch_offsets_for(
            sources, sizes, weights=weights, epoch_samples=epoch_samples, split=split
        )
    quotas = mix_quotas_for(
        sources, sizes, epoch, weights=weights, epoch_samples=epoch_samples, split=split
    )
    return MixEpoch(
        sizes=tuple(int(n) for n in sizes), quotas=quotas, offsets=offsets(epoch),
        seed=seed, epoch=epoch, block=block,
    )  # fmt: skip
