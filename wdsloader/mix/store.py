"""``MixStore``: the shards of several built datasets read as one split, each shard through the
store of its own dataset."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from wdsloader.format import Manifest, ShardInfo
from wdsloader.format.lengths import LENGTHS_FIELD
from wdsloader.io.ranges import Cut, Request
from wdsloader.io.store import Store
from wdsloader.mix.source import MixSource, mix_names
from wdsloader.mix.spec import MixSpec, merge_manifests
from wdsloader.mix.tokens import same_lengths_field, source_lengths

__all__ = ["MixStore", "open_mix"]


class MixStore:
    """Reads the concatenated shards of a mix: ``shards[i]`` through ``stores[store_of[i]]``.

    A :class:`~wdsloader.io.store.Store` (index, byte ranges, one joined buffer, close, URLs
    and redaction) that asks each shard's own store; a shard is told by identity, as
    the reader passes the very :class:`ShardInfo` objects it was given (pickling keeps that
    identity: the dataset holds both lists).
    """

    def __init__(
        self, stores: Sequence[Store], shards: Sequence[ShardInfo], store_of: Sequence[int]
    ) -> None:
        if len(shards) != len(store_of):
            raise ValueError(f"{len(store_of)} store indexes for {len(shards)} shards")
        self.stores = list(stores)
        self.shards = list(shards)
        self.store_of = [int(i) for i in store_of]
        self._owner = self._owners()
        self._stats: tuple[tuple[int, ...], _SummedStats] | None = None

    def _owners(self) -> dict[int, Store]:
        return {id(s): self.stores[i] for s, i in zip(self.shards, self.store_of, strict=True)}

    def __getstate__(self) -> dict[str, Any]:
        return {"stores": self.stores, "shards": self.shards, "store_of": self.store_of}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.stores, self.shards, self.store_of = (
            state["stores"],
            state["shards"],
            state["store_of"],
        )
        self._owner = self._owners()
        self._stats = None

    def __repr__(self) -> str:
        return f"MixStore({self.stores!r})"

    @property
    def stats(self) -> Mapping[str, int]:
        """Every source store's counts summed (``bytes_read``, ``requests`` ...): a live view,
        the same object until a source store's counters are replaced (a worker's fresh ones)."""
        key = tuple(id(getattr(s, "stats", None)) for s in self.stores)
        if self._stats is None or self._stats[0] != key:
            self._stats = (key, _SummedStats(self.stores))
        return self._stats[1]

    def _store(self, shard: ShardInfo) -> Store:
        return self._owner[id(shard)]

    @property
    def reads_locally(self) -> bool:
        """True when every source reads local files (see :attr:`Store.reads_locally`)."""
        return all(s.reads_locally for s in self.stores)

    def url(self, shard: ShardInfo) -> str:
        """Full path or URL of a shard, for messages (credentials redacted)."""
        return self._store(shard).url(shard)

    def redact(self, text: object) -> str:
        """``text`` with every source's credentials replaced by ``***``."""
        out = str(text)
        for store in self.stores:
            out = store.redact(out)
        return out

    def index(self, shard: ShardInfo) -> np.ndarray:
        """Sample start offsets of a shard, then its end offset."""
        return self._store(shard).index(shard)

    def read_side_file(self, shard: ShardInfo, rel: str, size: int | None = None) -> bytes:
        """A small file beside ``shard``, read by the shard's own store."""
        return self._store(shard).read_side_file(shard, rel, size)

    def load_indexes(self, shards: Sequence[ShardInfo]) -> None:
        """Read the indexes of ``shards`` not read yet, each source's concurrently."""
        groups: dict[int, list[ShardInfo]] = {}
        for shard in shards:
            groups.setdefault(id(self._store(shard)), []).append(shard)
        for group in groups.values():
            self._store(group[0]).load_indexes(group)

    def close(self) -> None:
        """Close every source's files."""
        for store in self.stores:
            store.close()

    def _groups(self, requests: Sequence[Request]) -> dict[int, list[int]]:
        """Request positions by store (in first-use order)."""
        groups: dict[int, list[int]] = {}
        for k, (shard, _, _) in enumerate(requests):
            groups.setdefault(id(self._store(shard)), []).append(k)
        return groups

    def read_ranges(self, requests: Sequence[Request]) -> list[bytes]:
        """The bytes of each ``(shard, start, stop)`` range, in request order."""
        out: list[bytes] = [b""] * len(requests)
        for members in self._groups(requests).values():
            store = self._store(requests[members[0]][0])
            datas = store.read_ranges([requests[k] for k in members])
            for k, data in zip(members, datas, strict=True):
                out[k] = data
        return out

    def read_joined(
        self,
        requests: Sequence[Request],
        out: np.ndarray | None = None,
        cuts: Sequence[Sequence[Cut]] | None = None,
    ) -> tuple[bytes | np.ndarray, list[int]]:
        """The ranges in one buffer (grouped by source) and where each starts; the start of
        ``out`` when it is large enough; ``cuts`` as in :meth:`ShardStore.read_joined`."""
        groups = self._groups(requests)
        if len(groups) == 1:
            return self._store(requests[0][0]).read_joined(requests, out, cuts)
        total = sum(int(stop) - int(start) for _, start, stop in requests)
        if out is not None and out.dtype == np.uint8 and out.ndim == 1 and len(out) >= total:
            buf = out[:total]
        else:
            buf = np.empty(total, dtype=np.uint8)
        positions = [0] * len(requests)
        at = 0
        for members in groups.values():
            store = self._store(requests[members[0]][0])
            part = [requests[k] for k in members]
            size = sum(int(stop) - int(start) for _, start, stop in part)
            part_cuts = [cuts[k] for k in members] if cuts is not None else None
            data, pos = store.read_joined(part, buf[at : at + size], part_cuts)
            if not (isinstance(data, np.ndarray) and np.shares_memory(data, buf)):
                buf[at : at + size] = np.frombuffer(data, dtype=np.uint8)
            for k, p in zip(members, pos, strict=True):
                positions[k] = at + p
            at += size
        return buf, positions


def open_mix(
    sources: Sequence[MixSource],
    split: str,
    fields: Sequence[str] | None,
    mix_options: dict[str, Any],
    open_one: Callable[[str], tuple[Store, Manifest]],
    read_lengths: Callable[[str, Sequence[ShardInfo]], np.ndarray] | None = None,
) -> tuple[MixStore, Manifest, MixSpec]:
    """The store over every source's shards (each opened by ``open_one(url)``), the one manifest
    they are read through (schemas checked to agree on ``fields``) and the mix spec with
    ``mix_options`` (weights, epoch_samples, batching, source_field, unit, epoch_tokens);
    ``unit="tokens"`` reads the sources' lengths with ``read_lengths(url, shards)``."""
    names = mix_names(sources)
    opened = [open_one(str(src.url)) for src in sources]
    manifests = [m for _, m in opened]
    merged = merge_manifests(names, manifests, split, fields)
    counts = [len(m.split(split).shards) for m in manifests]
    store_of = [i for i, n in enumerate(counts) for _ in range(n)]
    store = MixStore([st for st, _ in opened], merged.split(split).shards, store_of)
    lengths = None
    if mix_options.get("unit") == "tokens":
        if read_lengths is None:
            raise ValueError('a mix of unit="tokens" needs a reader of its sources\' lengths')
        lengths = tuple(
            source_lengths(
                n, str(src.url), m.split(split).shards, split,
                functools.partial(read_lengths, str(src.url)),
            )
            for n, src, m in zip(names, sources, manifests, strict=True)
        )  # fmt: skip
        same_lengths_field(names, [m.build.get(LENGTHS_FIELD) for m in manifests])
    spec = MixSpec(
        sources=tuple(sources), sizes=tuple(m.split(split).num_samples for m in manifests),
        shards=tuple(counts), split=split, lengths=lengths, **mix_options,
    )  # fmt: skip
    return store, merged, spec


class _SummedStats(Mapping[str, int]):
    """The sum of several stores' ``stats`` counters, read when asked."""

    def __init__(self, stores: Sequence[Store]) -> None:
        self._stores = stores

    def _each(self) -> list[Mapping[str, int]]:
        return [getattr(s, "stats", {}) for s in self._stores]

    def __getitem__(self, key: str) -> int:
        parts = [m[key] for m in self._each() if key in m]
        if not parts:
            raise KeyError(key)
        return sum(parts)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for m in self._each() for k in m))

    def __len__(self) -> int:
        return sum(1 for _ in self)
