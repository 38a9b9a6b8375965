"""The plan's inputs (:class:`PlanConfig`) and its algorithm version (:data:`PLAN_ALGORITHM`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wdsloader.format.checks import MAX_INT, as_int

__all__ = ["PLAN_ALGORITHM", "PlanConfig"]

# The plan algorithm's name and version, recorded in every loader state: bump the version whenever
# the same PlanConfig, epoch, rank and worker would yield other sample ids (a state saved under
# another version is then refused instead of resuming onto other samples).
# Version 1 ("span-permutation") permuted every span of the split in every worker; version 2
# evaluates a keyed permutation of span ids only at the positions a worker reads.
PLAN_ALGORITHM: tuple[str, int] = ("span-feistel", 2)

MAX_SEED = 2**256 - 1
"""The largest seed: a SHA-256 digest's (seeds feed numpy's SeedSequence, any size)."""

# Constant tags mixed into the seed sequences so that the streams of the different steps never coincide.
# Changing one changes every plan: they are part of the resume contract.
ORDER_TAG = 0x0DE5_5EED
WINDOW_TAG = 0x3A1D_5EED


def _counts(counts: object) -> tuple[int, ...]:
    if isinstance(counts, (str, bytes, dict)) or not hasattr(counts, "__iter__"):
        raise ValueError(f"counts must be a sequence of per-shard sample counts, got {counts!r}")
    values = tuple(counts)
    if all(type(c) is int and c >= 0 for c in values):  # the common case, fast for 10^5 shards
        return values
    return tuple(as_int(c, f"counts[{i}]", 0) for i, c in enumerate(values))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """Everything the plan depends on except epoch, rank and worker (the same on every rank).

    ``counts`` are the samples per shard in manifest order; ``num_workers`` counts plan workers (at
    least 1: a DataLoader with ``num_workers=0`` is one worker); ``span`` consecutive samples of a shard
    stay together when shuffling; ``window`` is the per-worker shuffle window in samples (0 or 1: none).
    """

    counts: tuple[int, ...]
    batch_size: int
    world_size: int = 1
    num_workers: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    span: int = 1
    window: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", _counts(self.counts))
        for name in ("batch_size", "world_size", "num_workers", "span"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 1))
        for name in ("seed", "window"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 0))
        if self.seed > MAX_SEED:  # a loader state holds it: the same bound
            raise ValueError(f"seed must be <= 2**256 - 1, got a {self.seed.bit_length()}-bit int")
        for name in ("shuffle", "drop_last"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.num_samples > MAX_INT:  # sample ids and positions are int64
            raise ValueError(
                f"counts sum to {self.num_samples} samples, more than an int64 holds ({MAX_INT})"
            )

    @property
    def num_samples(self) -> int:
        """Samples in the split (sum of ``counts``)."""
        return sum(self.counts)


def describe(cfg: PlanConfig) -> str:
    """The plan's size and topology, for error messages."""
    return (
        f"the plan with {cfg.num_samples} samples, world_size={cfg.world_size}, "
        f"num_workers={cfg.num_workers}, batch_size={cfg.batch_size}, drop_last={cfg.drop_last}"
    )
