"""Random access to built (or adopted) shards: a map-style dataset, by index and by key."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from wdsloader.decode.parse import parse_sample
from wdsloader.decode.registry import SampleDecoder
from wdsloader.format import ShardInfo
from wdsloader.format.deflate import inflate_sample
from wdsloader.format.keyindex import key_records, positions_of
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.io.side_files import read_key_index
from wdsloader.stream.inputs import open_dataset

log = logging.getLogger(__name__)


class ShardDataset(Dataset[dict[str, Any]]):
    """The samples of ``split`` of the dataset at ``source`` (a path or fsspec URL) by position:
    ``ds[i]`` is the split's ``i``-th sample in manifest order (shard by shard, as
    :func:`~wdsloader.create_loader` numbers them in ``__index__``; negative ``i`` counts from
    the end), ``ds.get(key)`` the sample with that key.

    A sample is the dict the loader decodes before collating: the requested ``fields`` (default:
    all the schema's), ``__key__`` and ``__index__``. Only the sample's byte range is read
    (local files and remote URLs alike). Works in a torch ``DataLoader`` with any sampler and
    workers. ``storage_options``/``read_options`` as for ``create_loader``; pickled fields are
    decoded only with ``allow_pickle=True``. The curriculum's output field is not made here (a
    sample holds its stored variants).

    Keys: :meth:`get` reads each shard's key index (sorted 64-bit key hashes, 12 bytes a
    sample, written by ``build_shards`` and ``adopt``) once, on the first lookup that needs it;
    a shard without one (a dataset of an earlier version) has its keys read from its samples'
    headers once instead, with a log line.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        split: str = "train",
        *,
        fields: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        read_options: ReadOptions | None = None,
        allow_pickle: bool = False,
    ) -> None:
        options = read_options if read_options is not None else ReadOptions()
        if storage_options is not None:
            options = dataclasses.replace(options, storage_options=storage_options)
        self.root, self.split, self.options = os.fspath(source), split, options
        self.store: ShardStore
        self.store, self.manifest = open_dataset(self.root, options, False, split)
        self.shards: list[ShardInfo] = list(self.manifest.split(split).shards)
        counts = [s.num_samples for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.decoder = SampleDecoder(
            self.manifest.schema or None,
            None if fields is None else list(fields),
            allow_pickle=allow_pickle,
            dims=self.manifest.dims,
        )
        self._offsets: dict[int, np.ndarray] = {}
        self._keys: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __repr__(self) -> str:
        return (
            f"ShardDataset({self.store.redact(self.root)!r}, {self.split!r}, {len(self)} samples)"
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"a ShardDataset is indexed by an int, got {index!r}")
        return self._read(*self._locate(index))

    def _locate(self, index: int) -> tuple[int, int]:
        """``(shard, position in it)`` of sample ``index`` (negative: from the end)."""
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(
                f"index {int(index)} out of range for split {self.split!r} ({n} samples)"
            )
        shard = int(np.searchsorted(self.starts, i, side="right")) - 1
        return shard, i - int(self.starts[shard])

    def members(self, index: int) -> tuple[str, dict[str, bytes]]:
        """Sample ``index``'s key and its members' bytes as stored (``{ext: bytes}``)."""
        shard, pos = self._locate(index)
        data, start, url = self._raw(shard, pos)
        key, members = parse_sample(data, 0, len(data), base_offset=start, source=url)
        return key, {ext: bytes(view) for ext, view in members.items()}

    def get(self, key: str) -> dict[str, Any]:
        """The sample whose key is ``key``; KeyError naming the key and the split if none."""
        for shard in range(len(self.shards)):
            for pos in positions_of(self._key_records(shard), key):
                sample = self._read(shard, pos)
                if sample["__key__"] == key:
                    return sample
        raise KeyError(f"no sample with key {key!r} in split {self.split!r} of {self.where}")

    @property
    def where(self) -> str:
        """The dataset's root, credentials redacted."""
        return str(self.store.redact(self.root))

    # -- reading ------------------------------------------------------------------------------
    def _index(self, shard: int) -> np.ndarray:
        offsets = self._offsets.get(shard)
        if offsets is None:
            offsets = self.store.index(self.shards[shard])
            self._offsets[shard] = offsets
        return offsets

    def _raw(self, shard: int, pos: int) -> tuple[bytes, int, str]:
        """Sample ``pos`` of ``shard`` as tar bytes, the shard offset of its first byte and the
        name the errors give it."""
        info = self.shards[shard]
        offsets = self._index(shard)
        start, stop = int(offsets[pos]), int(offsets[pos + 1])
        (data,) = self.store.read_ranges([(info, start, stop)])
        url = self.store.url(info)
        if info.compression is not None:
            data = inflate_sample(memoryview(data), f"{url}: sample #{pos}")
        return data, start, url

    def _read(self, shard: int, pos: int) -> dict[str, Any]:
        data, start, url = self._raw(shard, pos)
        key, members = parse_sample(data, 0, len(data), base_offset=start, source=url)
        sample = self.decoder(members, key, url)
        sample["__key__"] = key
        sample["__index__"] = int(self.starts[shard]) + pos
        return sample

    def _key_records(self, shard: int) -> np.ndarray:
        records = self._keys.get(shard)
        if records is None:
            with self._lock:
                records = self._keys.get(shard)
                if records is None:
                    records = self._load_keys(shard)
                    self._keys[shard] = records
        return records

    def _load_keys(self, shard: int) -> np.ndarray:
        """The key records of ``shard``: its key index when the manifest lists one (read through
        the store: its retries, deadline and cache), else read from its samples' headers."""
        info = self.shards[shard]
        if info.keys_path is None:
            return self._scan_keys(shard)
        return read_key_index(self.store, info)

    def _scan_keys(self, shard: int) -> np.ndarray:
        """The key records of ``shard``, from its samples' headers (the shard read once)."""
        t0 = time.perf_counter()
        info = self.shards[shard]
        offsets = self._index(shard)
        (data,) = self.store.read_ranges([(info, int(offsets[0]), int(offsets[-1]))])
        url = self.store.url(info)
        view, base = memoryview(data), int(offsets[0])
        keys = []
        for pos in range(info.num_samples):
            start, stop = int(offsets[pos]) - base, int(offsets[pos + 1]) - base
            if info.compression is not None:
                sample = inflate_sample(view[start:stop], f"{url}: sample #{pos}")
                key, _ = parse_sample(sample, 0, len(sample), base_offset=start + base, source=url)
            else:
                key, _ = parse_sample(view, start, stop, base_offset=base, source=url)
            keys.append(key)
        log.info(
            "%s: read the keys of %d samples for key lookup in %.2f s",
            url, len(keys), time.perf_counter() - t0,
        )  # fmt: skip
        return key_records(keys)
