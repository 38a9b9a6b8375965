"""``WEIGHTED``: each loader gets exactly its largest-remainder quota of the epoch's steps, in a
deterministic even interleave or, with ``choice_rng_seed``, a seeded permutation of bursts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.mix.sampling.base import BaseSampling, EpochLengthPolicy, Lengths
from wdsloader.plan.quotas import even_interleave, largest_remainder

if TYPE_CHECKING:
    from wdsloader.mix.schedule import MultiDataLoaderConfig

_CHOICE_TAG = 0x0C40_1CE5  # mixed into the seeded order's seed: part of the resume contract


def _bursts(units: np.ndarray, quotas: np.ndarray, burst: int) -> np.ndarray:
    """Each unit's loader for ``burst`` steps (a loader's last unit for what its quota leaves)."""
    if burst == 1:
        return units
    seen = np.zeros(quotas.size, dtype=np.int64)
    out = []
    for u in units.tolist():
        size = min(burst, int(quotas[u] - seen[u]))
        seen[u] += size
        out.append(np.full(size, u, dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class Weighted(BaseSampling):
    """Quotas of the epoch's steps (sum, max of the finite or min of the lengths, or
    ``steps_per_epoch``) by ``dataloader_weights``; the counts are exact, nothing is drawn
    independently per step."""

    name = "weighted"
    label = "WEIGHTED"
    options = frozenset({"dataloader_weights", "choice_rng_seed"})

    def configure(self, config: MultiDataLoaderConfig) -> dict[str, Any]:
        weights = config.dataloader_weights
        if weights is None:
            raise ValueError("Weights required for WEIGHTED strategy (dataloader_weights)")
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise ValueError(f"dataloader_weights must be a list of numbers, got {weights!r}")
        largest_remainder(weights, 0, what="dataloader_weights")  # checks them
        out: dict[str, Any] = {"dataloader_weights": tuple(float(w) for w in weights)}
        if config.choice_rng_seed is not None:
            out["choice_rng_seed"] = as_int(config.choice_rng_seed, "choice_rng_seed", 0)
        return out

    def epoch_steps(
        self, config: MultiDataLoaderConfig, lengths: Lengths, names: Sequence[str]
    ) -> int:
        if config.epoch_length_policy is EpochLengthPolicy.MAX_OF_LENGTHS:
            lens = [n for n in lengths if n is not None]  # the longest finite one
            if not lens:
                raise ValueError(f"{self.why(config)}: no loader has a length; use FIXED_NUM_STEPS")
            return max(lens)
        return super().epoch_steps(config, lengths, names)

    def schedule(
        self, config: MultiDataLoaderConfig, lengths: Lengths, total: int, epoch: int
    ) -> np.ndarray:
        assert config.dataloader_weights is not None
        quotas = largest_remainder(config.dataloader_weights, total, what="dataloader_weights")
        burst = config.burst_size
        units = -(-quotas // burst)  # bursts per loader, the last one possibly short
        if config.choice_rng_seed is None:
            order = even_interleave(units)
        else:
            seq = np.random.SeedSequence([config.choice_rng_seed, epoch, _CHOICE_TAG])
            order = np.random.default_rng(seq).permutation(np.repeat(np.arange(units.size), units))
        return _bursts(order, quotas, burst)


WEIGHTED = Weighted()
