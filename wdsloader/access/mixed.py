"""Random access to the sources of a mix: each batch's ``(__source__, __index__)`` pairs give back
the very samples a mixed :func:`~wdsloader.create_loader` yielded."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from wdsloader.access.dataset import ShardDataset
from wdsloader.io.fetch import ReadOptions
from wdsloader.mix.options import Mix
from wdsloader.mix.source import MixSource, mix_names

__all__ = ["MixedShardDataset"]


class MixedShardDataset(Dataset[dict[str, Any]]):
    """The samples of ``split`` of every source of ``mix`` (a :class:`~wdsloader.Mix` or a list
    of :class:`~wdsloader.MixSource`), each source a :class:`ShardDataset`.

    ``ds[source, i]`` is sample ``i`` of a source (its position in the mix or its name), as a
    mixed loader numbers it in ``__source__`` and ``__index__``; ``ds[i]`` counts the sources'
    samples one source after the other (negative ``i`` from the end), so that any torch sampler
    works; :meth:`batch` gives back the samples of a loader's batch. Each sample also carries
    ``__source__``. Options as for :class:`ShardDataset` (``storage_options`` serve every
    source; ``read_options.storage_options_for`` picks per-root ones).
    """

    def __init__(
        self,
        mix: Mix | Sequence[MixSource],
        split: str = "train",
        *,
        fields: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        read_options: ReadOptions | None = None,
        allow_pickle: bool = False,
    ) -> None:
        sources = tuple(mix.sources if isinstance(mix, Mix) else mix)
        self.names = mix_names(sources)
        self.split = split
        self.sources = [
            ShardDataset(
                os.fspath(s.url),
                split,
                fields=fields,
                storage_options=storage_options,
                read_options=read_options,
                allow_pickle=allow_pickle,
            )  # fmt: skip
            for s in sources
        ]
        self.starts = np.concatenate([[0], np.cumsum([len(d) for d in self.sources])])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {len(d)}" for n, d in zip(self.names, self.sources, strict=True))
        return f"MixedShardDataset({self.split!r}, {{{parts}}})"

    def source(self, which: int | str) -> ShardDataset:
        """The dataset of one source, by position in the mix or name (KeyError/IndexError
        naming the sources when there is none)."""
        return self.sources[self._position(which)]

    def _position(self, which: int | str | np.integer) -> int:
        if isinstance(which, str):
            if which not in self.names:
                raise KeyError(f"no source {which!r} in the mix; its sources: {list(self.names)}")
            return self.names.index(which)
        if isinstance(which, (bool, np.bool_)) or not isinstance(which, (int, np.integer)):
            raise TypeError(f"a source is named by its position or name, got {which!r}")
        if not 0 <= int(which) < len(self.sources):
            raise IndexError(f"source {int(which)} out of range: the mix has {list(self.names)}")
        return int(which)

    def __getitem__(self, item: int | tuple[int | str, int]) -> dict[str, Any]:
        if isinstance(item, tuple):
            which, index = item
            position = self._position(which)
            sample = self.sources[position][index]
        else:
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise TypeError(f"a MixedShardDataset is indexed by an int or (source, int), "
                                f"got {item!r}")  # fmt: skip
            n = len(self)
            i = int(item) + n if item < 0 else int(item)
            if not 0 <= i < n:
                raise IndexError(f"index {int(item)} out of range for the mix ({n} samples)")
            position = int(np.searchsorted(self.starts, i, side="right")) - 1
            sample = self.sources[position][i - int(self.starts[position])]
        sample["__source__"] = position
        return sample

    def get(self, key: str, source: int | str | None = None) -> dict[str, Any]:
        """The sample whose key is ``key`` in ``source`` (default: the first source that has
        it); KeyError naming the key, the split and the sources looked in."""
        where = range(len(self.sources)) if source is None else [self._position(source)]
        for position in where:
            try:
                sample = self.sources[position].get(key)
            except KeyError:
                continue
            sample["__source__"] = position
            return sample
        looked = [self.names[p] for p in where]
        raise KeyError(f"no sample with key {key!r} in split {self.split!r} of sources {looked}")

    def batch(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """The samples of a mixed loader's ``batch``, from its ``__source__`` and
        ``__index__``, in batch order."""
        sources = np.asarray(batch["__source__"]).tolist()
        indices = np.asarray(batch["__index__"]).tolist()
        return [self[s, i] for s, i in zip(sources, indices, strict=True)]
