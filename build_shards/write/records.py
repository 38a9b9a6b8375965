"""The record of a finished block, as the workers return it and ``_build/block-BBBBB.json`` holds it.

A record is what makes a rerun skip its block: the block's shards and remainders (a small last
shard, kept under ``_build/rest/`` until the end of the build) per split, its counts, its keys
per split (for the duplicate check across blocks) and the digests of its first and last items (a
rerun compares them with its own source before it keeps the block). A record on disk that does
not parse as one (an older or damaged file) is a :class:`RecordError`: its block is redone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.format import ShardInfo


class RecordError(ValueError):
    """A block record that is not one this version reads (its block must be redone)."""


@dataclass(frozen=True, slots=True)
class BlockEnd:
    """The first or last item of a block: its source index, key (None: dropped by ``map``) and
    the digest of the item as the block stores it (key, split, encoded members)."""

    index: int
    key: str | None
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "key": self.key, "digest": self.digest}

    @classmethod
    def from_dict(cls, d: Any) -> BlockEnd:
        d = _mapping(d, "first/last item")
        key = d.get("key")
        if key is not None and not isinstance(key, str):
            raise RecordError(f"item key {key!r} is not a string")
        return cls(_int(d, "index"), key, _str(d, "digest"))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BlockRecord:
    """A finished block: source items ``[start, stop)``, its shards per split (in order of first
    appearance), counts, the keys of its samples per split (``keys``; replaced by their hashes in
    ``key_hashes`` by :meth:`compact` while a build holds every record in memory)."""

    block: int
    start: int
    stop: int
    num_items: int
    num_samples: int
    skipped: int  # items ``map`` dropped
    nan_samples: int
    nan_keys: tuple[str, ...]  # the first few keys of samples holding NaN or Inf
    fingerprint: str
    first: BlockEnd
    last: BlockEnd
    splits: Mapping[str, tuple[ShardInfo, ...]]
    # per split, the block's small last shard (its part number is len(splits[split])), written
    # under ``_build/rest/`` and packed with the other blocks' at the end (build_shards.write.rests)
    rests: Mapping[str, ShardInfo] = dataclasses.field(default_factory=dict)
    keys: Mapping[str, tuple[str, ...]] | None = None
    key_hashes: Mapping[str, np.ndarray] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as ``_build/block-BBBBB.json`` holds it (with its keys)."""
        return {
            "block": self.block,
            "start": self.start,
            "stop": self.stop,
            "num_items": self.num_items,
            "num_samples": self.num_samples,
            "skipped": self.skipped,
            "nan_samples": self.nan_samples,
            "nan_keys": list(self.nan_keys),
            "fingerprint": self.fingerprint,
            "first": self.first.to_dict(),
            "last": self.last.to_dict(),
            "splits": {s: [shard_info_dict(i) for i in infos] for s, infos in self.splits.items()},
            "rests": {s: shard_info_dict(info) for s, info in self.rests.items()},
            "keys": {s: list(ks) for s, ks in (self.keys or {}).items()},
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_dict(cls, d: Any) -> BlockRecord:
        """The record of a parsed ``block-BBBBB.json``; :class:`RecordError` when it is not one."""
        d = _mapping(d, "block record")
        splits = _mapping(d.get("splits"), "splits")
        keys = _mapping(d.get("keys", {}), "keys")
        rests = _mapping(d.get("rests", {}), "rests")
        try:
            return cls(
                block=_int(d, "block"),
                start=_int(d, "start"),
                stop=_int(d, "stop"),
                num_items=_int(d, "num_items"),
                num_samples=_int(d, "num_samples"),
                skipped=_int(d, "skipped"),
                nan_samples=_int(d, "nan_samples"),
                nan_keys=tuple(_strs(d.get("nan_keys", []), "nan_keys")),
                fingerprint=_str(d, "fingerprint"),
                first=BlockEnd.from_dict(d.get("first")),
                last=BlockEnd.from_dict(d.get("last")),
                splits={_key(s): tuple(map(shard_info_from_dict, v)) for s, v in splits.items()},
                rests={_key(s): shard_info_from_dict(v) for s, v in rests.items()},
                keys={_key(s): tuple(_strs(v, "keys")) for s, v in keys.items()},
            )
        except TypeError as exc:  # a list where a dict belongs, and the like
            raise RecordError(f"malformed block record: {exc}") from None

    @classmethod
    def from_json(cls, data: bytes) -> BlockRecord:
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise RecordError(f"not JSON: {exc}") from None
        return cls.from_dict(body)

    def all_shards(self) -> list[ShardInfo]:
        """Every shard file the block wrote: its shards and its remainders."""
        return [s for shards in self.splits.values() for s in shards] + list(self.rests.values())

    def compact(self) -> BlockRecord:
        """This record with its key lists replaced by arrays of their hashes (8 bytes a key), to
        check duplicates across blocks at the end; the keys stay on disk in the record."""
        keys = self.keys or {}
        hashes = {s: np.fromiter(map(hash, ks), np.int64, len(ks)) for s, ks in keys.items()}
        return dataclasses.replace(self, keys=None, key_hashes=hashes)


def shard_info_dict(info: ShardInfo) -> dict[str, Any]:
    """A shard's entry in a block record."""
    return {
        "path": info.path,
        "idx_path": info.idx_path,
        "num_samples": info.num_samples,
        "num_bytes": info.num_bytes,
        "sha256": info.sha256,
        "layout": info.layout,
        **({} if info.keys_path is None else {"keys_path": info.keys_path}),
        **({} if info.lengths_path is None else {"lengths_path": info.lengths_path}),
        **({} if info.lengths_sha256 is None else {"lengths_sha256": info.lengths_sha256}),
    }


def shard_info_from_dict(d: Any) -> ShardInfo:
    d = _mapping(d, "shard entry")
    sha, layout, keys = d.get("sha256"), d.get("layout"), d.get("keys_path")
    if keys is not None and not isinstance(keys, str):
        raise RecordError(f"shard keys_path {keys!r} is not a string")
    lengths = d.get("lengths_path")
    if lengths is not None and not isinstance(lengths, str):
        raise RecordError(f"shard lengths_path {lengths!r} is not a string")
    lengths_sha = d.get("lengths_sha256")
    for what, value in (("sha256", sha), ("lengths_sha256", lengths_sha)):
        if value is not None and not isinstance(value, str):
            raise RecordError(f"shard {what} {value!r} is not a string")
    if layout is not None and not isinstance(layout, dict):
        raise RecordError(f"shard layout {layout!r} is not a dict")
    return ShardInfo(
        path=_str(d, "path"),
        idx_path=_str(d, "idx_path"),
        num_samples=_int(d, "num_samples"),
        num_bytes=_int(d, "num_bytes"),
        sha256=sha,
        layout=layout,
        keys_path=keys,
        lengths_path=lengths,
        lengths_sha256=lengths_sha,
    )


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RecordError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _int(d: Mapping[str, Any], name: str) -> int:
    value = d.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{name} is {value!r}, not an int")
    return value


def _str(d: Mapping[str, Any], name: str) -> str:
    value = d.get(name)
    if not isinstance(value, str):
        raise RecordError(f"{name} is {value!r}, not a string")
    return value


def _key(value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"split name {value!r} is not a string")
    return value


def _strs(values: Any, name: str) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise RecordError(f"{name} is not a list of strings")
    return values
