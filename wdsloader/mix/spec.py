"""``MixSpec``: a sample-level mix as the loader runs it (the sources, their sizes in the split
and the mix options), and the one manifest the loader reads the sources through
(:func:`merge_manifests`: the sources' shards concatenated, their schemas checked to agree)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.curriculum.schedule import CallableSchedule, Schedule
from wdsloader.format import FieldSpec, Manifest, ShardInfo, SplitInfo
from wdsloader.format.checks import MAX_INT, as_int
from wdsloader.mix.offsets import EpochOffsets
from wdsloader.mix.source import MixSource, epoch_offsets_for, mix_epoch, mix_names
from wdsloader.mix.tokens import TokenPlan, check_unit
from wdsloader.plan.batching import BUILTIN_BATCHINGS, get_batching_strategy
from wdsloader.plan.mix import MixEpoch

__all__ = ["MIX_ALGORITHM", "BATCHINGS", "MixSpec", "merge_manifests"]

# The mix plan's name and version, recorded in the "mix" part of a mix loader's stage
# fingerprint: bump it whenever the same spec, epoch, rank and worker would yield other samples.
MIX_ALGORITHM: tuple[str, int] = ("mix-feistel", 1)
BATCHINGS = BUILTIN_BATCHINGS  # the built-in strategies; the registry: batching_strategies()


@dataclass(frozen=True, slots=True, kw_only=True)
class MixSpec:
    """A mix of ``sources`` (their ``sizes``: samples in the split, and ``shards``: shards in
    the split, concatenated in source order) with the options of
    :func:`~wdsloader.create_loader`: ``weights`` (a schedule of weights over epochs, for the
    sources without ``samples``/``repeat``), ``epoch_samples``, ``batching`` (a registered
    strategy's name: :func:`~wdsloader.plan.batching.batching_strategies`) and ``source_field``
    (the batch field holding each sample's source index, or None)."""

    sources: tuple[MixSource, ...]
    sizes: tuple[int, ...]
    shards: tuple[int, ...]
    weights: Schedule | None = None
    epoch_samples: int | None = None
    batching: str = "mixed"
    source_field: str | None = None
    split: str | None = None  # the split the sizes count (named in errors)
    unit: str = "samples"  # or "tokens": quotas in tokens (wdsloader.mix.tokens)
    epoch_tokens: int | None = None
    # unit="tokens": each source's documents' lengths by sample id in the split
    lengths: tuple[np.ndarray, ...] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    # the streams' positions at each epoch's start, kept from one epoch to the next
    _offsets: EpochOffsets | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )
    _tokens: TokenPlan | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        mix_names(self.sources)
        n = len(self.sources)
        if len(self.sizes) != n or len(self.shards) != n:
            raise ValueError(
                f"{len(self.sizes)} sizes and {len(self.shards)} shard counts for {n} sources"
            )
        get_batching_strategy(self.batching)  # a registered strategy (ValueError listing them)
        if self.weights is not None and not isinstance(self.weights, Schedule):
            raise TypeError(
                f"weights must be a schedule (wdsloader.curriculum.fixed, linear, cosine, steps, "
                f"from_callable), got {type(self.weights).__name__}"
            )
        if self.epoch_samples is not None:
            as_int(self.epoch_samples, "epoch_samples", 1)
        if self.source_field is not None and (
            not isinstance(self.source_field, str) or not self.source_field
        ):
            raise ValueError(f"source_field must be a non-empty string, got {self.source_field!r}")
        if sum(self.sizes) > MAX_INT:  # split-wide sample ids are int64
            where = "" if self.split is None else f" in split {self.split!r}"
            raise ValueError(
                f"the sources hold {sum(self.sizes)} samples{where}, more than an int64 holds "
                f"({MAX_INT}): {dict(zip(self.names, self.sizes, strict=True))}"
            )
        check_unit(self.unit, self.sources, self.epoch_samples, self.epoch_tokens)
        if self.unit == "tokens":
            if self.lengths is None:
                raise ValueError('a mix of unit="tokens" needs its sources\' lengths')
            tokens = TokenPlan(
                self.sources, self.lengths, weights=self.weights, epoch_tokens=self.epoch_tokens,
                split=self.split,
            )  # fmt: skip
            object.__setattr__(self, "_tokens", tokens)
        offsets = epoch_offsets_for(
            self.sources, self.sizes, weights=self.weights, epoch_samples=self.epoch_samples,
            split=self.split,
        )  # fmt: skip
        object.__setattr__(self, "_offsets", offsets)
        self.epoch(0)  # the options' errors (weights, quotas) at create_loader

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(s.name) for s in self.sources)

    @property
    def offsets(self) -> np.ndarray:
        """The split-wide sample id of each source's first sample (int64)."""
        sizes = np.asarray(self.sizes, dtype=np.int64)
        out: np.ndarray = np.cumsum(sizes) - sizes
        return out

    def shard_source(self) -> np.ndarray:
        """The source index of each shard of the concatenated split (int64)."""
        return np.repeat(np.arange(len(self.sources), dtype=np.int64), self.shards)

    def epoch(self, epoch: int, *, seed: int = 0, block: int = 1) -> MixEpoch:
        """The mix plan's input for ``epoch`` (see :func:`~wdsloader.mix.mix_epoch`; with
        ``unit="tokens"``: :meth:`~wdsloader.mix.tokens.TokenPlan.epoch`)."""
        if self._tokens is not None:
            return self._tokens.epoch(epoch, seed=seed, block=block)
        return mix_epoch(
            self.sources, self.sizes, epoch, seed=seed, block=block, weights=self.weights,
            epoch_samples=self.epoch_samples, offsets=self._offsets, split=self.split,
        )  # fmt: skip

    def fingerprint(self) -> str:
        """The mix's part of a loader state's stage fingerprint: the algorithm, the batching
        and a digest of the sources (names, weights, samples, repeat, sizes) and options."""
        name, version = MIX_ALGORITHM
        weights: Any = None
        if isinstance(self.weights, CallableSchedule):
            fn = self.weights.fn
            target = fn if hasattr(fn, "__qualname__") else type(fn)
            weights = f"{target.__module__}.{target.__qualname__}"
        elif self.weights is not None:
            weights = self.weights.to_dict()
        desc = {
            "sources": [[s.name, s.weight, s.samples, s.repeat] for s in self.sources],
            "sizes": list(self.sizes),
            "weights": weights,
            "epoch_samples": self.epoch_samples,
            "source_field": self.source_field,
        }
        if self._tokens is not None:  # only then: the fingerprints of sample mixes stay
            desc |= {"unit": self.unit, "epoch_tokens": self.epoch_tokens}
            desc["tokens"] = list(self._tokens.totals)
        text = json.dumps(desc, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return f"{name}/{version}:{self.batching}:{','.join(self.names)}:{digest}"


def _resolved(spec: FieldSpec, dims: dict[str, int]) -> tuple[Any, ...]:
    shape = (
        None
        if spec.shape is None
        else tuple(dims.get(d, d) if isinstance(d, str) else d for d in spec.shape)
    )
    return (spec.ext, spec.encoding, spec.dtype, shape)


def _show(spec: FieldSpec, dims: dict[str, int]) -> str:
    bound = {d: dims[d] for d in spec.shape or () if isinstance(d, str) and d in dims}
    text = (
        f"ext={spec.ext!r}, encoding={spec.encoding!r}, dtype={spec.dtype!r}, shape={spec.shape!r}"
    )
    return text + "".join(f", {d}={v}" for d, v in bound.items())


def merge_manifests(
    names: Sequence[str], manifests: Sequence[Manifest], split: str, fields: Sequence[str] | None
) -> Manifest:
    """One manifest over the sources' ``split``: their shards concatenated in source order,
    the schema of the requested ``fields`` (None: every field of the first source), which every
    source must hold with the same extension, encoding, dtype and shape (symbolic dims compared
    as bound); ValueError naming the sources, the field and both specs otherwise."""
    first, name0 = manifests[0], names[0]
    wanted = list(first.schema) if fields is None else list(fields)
    schema: dict[str, FieldSpec] = {}
    for field in wanted:
        holders = [(n, m) for n, m in zip(names, manifests, strict=True) if field in m.schema]
        if not any(m.schema for m in manifests):
            continue  # schema-less sources: whatever the samples hold
        if len(holders) != len(manifests):
            lacking = [n for n, m in zip(names, manifests, strict=True) if field not in m.schema]
            raise ValueError(
                f"field {field!r} is in sources {[n for n, _ in holders]} but not in {lacking}; "
                "pass fields= with fields every source holds"
            )
        ref_name, ref = holders[0]
        for other_name, other in holders[1:]:
            a, b = ref.schema[field], other.schema[field]
            if _resolved(a, ref.dims) != _resolved(b, other.dims):
                raise ValueError(
                    f"sources {ref_name!r} and {other_name!r} disagree on field {field!r}: "
                    f"{ref_name}: {_show(a, ref.dims)}; {other_name}: {_show(b, other.dims)} "
                    "(pass fields= to read the fields they share)"
                )
        schema[field] = ref.schema[field]
    shards: list[ShardInfo] = [s for m in manifests for s in m.split(split).shards]
    defaults = first.loader_defaults
    same = all(m.loader_defaults == defaults for m in manifests)
    return Manifest(
        schema=schema, dims=dict(first.dims), splits={split: SplitInfo(shards=shards)},
        build={"mix": list(names), "first": name0}, loader_defaults=dict(defaults) if same else {},
    )  # fmt: skip
