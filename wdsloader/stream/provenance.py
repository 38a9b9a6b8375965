"""Where each sample of a batch comes from: its position in its split (``__index__``, what
:class:`~wdsloader.access.ShardDataset` indexes and ``loader.batch_indices`` names) and, reading
a mix of sources, its source's position in the mix (``__source__``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from wdsloader.mix.spec import MixSpec

INDEX = "__index__"
SOURCE = "__source__"


class Provenance:
    """Each sample's ``__index__`` (and ``__source__``) from the shard it was read from and its
    position there; ``counts``: the samples of each shard of the split (of the sources'
    concatenated splits for a ``mix``)."""

    def __init__(self, counts: Sequence[int], mix: MixSpec | None = None) -> None:
        sizes = np.asarray(counts, dtype=np.int64)
        self.starts = np.cumsum(sizes) - sizes
        self.offsets = None if mix is None else mix.offsets
        self.shard_source = None if mix is None else mix.shard_source()

    def of(self, shard: np.ndarray, local: np.ndarray) -> dict[str, np.ndarray]:
        """The provenance columns of samples ``local`` of shards ``shard`` (int64 arrays)."""
        ids = self.starts[shard] + local
        if self.offsets is None or self.shard_source is None:
            return {INDEX: ids}
        source = self.shard_source[shard]
        return {INDEX: ids - self.offsets[source], SOURCE: source}

    @staticmethod
    def ensure(batch: Any, values: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
        """``batch`` with the provenance fields, when it is a dict the collator made without
        them (a collator that builds its own batch, e.g. for text): ``values`` are the columns
        or the samples it was made from."""
        if not isinstance(batch, dict) or INDEX in batch:
            return batch
        for name in (INDEX, SOURCE):
            if isinstance(values, Mapping):
                column = values.get(name)
            else:
                column = None if not values or name not in values[0] else [s[name] for s in values]
            if column is not None:
                batch[name] = torch.as_tensor(np.asarray(column, dtype=np.int64))
        return batch
