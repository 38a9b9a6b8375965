"""The key index of a shard: its samples' keys as sorted 64-bit hashes with each sample's position,
so that a sample is found by key without reading the shard.

Bytes: little-endian records of ``(uint64 hash, uint32 position)``, sorted by hash (then by
position). The hash is the first 8 bytes of BLAKE2b of the key's UTF-8 bytes (surrogates escaped):
the same in every process and on every machine. Two keys may share a hash: a reader checks the
key of the sample it reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from wdsloader.errors import ShardFormatError

KEY_RECORD = np.dtype([("hash", "<u8"), ("pos", "<u4")])
KEYS_SUFFIX = ".wdskeys"


def keys_path(shard_path: str) -> str:
    """Path of the key index beside a shard: ``a/b/X.tar`` -> ``a/b/.X.tar.wdskeys``."""
    head, sep, name = shard_path.rpartition("/")
    return f"{head}{sep}.{name}{KEYS_SUFFIX}"


def key_hash(key: str) -> int:
    """The 64-bit hash of ``key`` the key index sorts by."""
    return raw_key_hash(key.encode("utf-8", "surrogateescape"))


def raw_key_hash(raw_key: bytes) -> int:
    """:func:`key_hash` of a key given as its UTF-8 bytes."""
    return int.from_bytes(hashlib.blake2b(raw_key, digest_size=8).digest(), "little")


def key_records(keys: Sequence[str]) -> np.ndarray:
    """The sorted key-index records of ``keys`` (the samples of one shard, in order)."""
    return hash_records([key_hash(k) for k in keys])


def hash_records(hashes: Sequence[int]) -> np.ndarray:
    """The sorted key-index records of the samples whose key hashes are ``hashes``, in order."""
    records = np.empty(len(hashes), dtype=KEY_RECORD)
    records["hash"] = np.asarray(hashes, dtype=np.uint64)
    records["pos"] = np.arange(len(hashes), dtype=np.uint32)
    return np.sort(records, order=["hash", "pos"])


def encode_key_index(keys: Sequence[str]) -> bytes:
    """The bytes of the key index of a shard whose samples have ``keys``, in order."""
    return key_records(keys).tobytes()


def decode_key_index(data: bytes, num_samples: int, *, source: str = "<key index>") -> np.ndarray:
    """The records of a key index (checked: one per sample, sorted, positions in range)."""
    if len(data) != num_samples * KEY_RECORD.itemsize:
        raise ShardFormatError(
            f"{source}: {len(data)} bytes, expected {num_samples} records of "
            f"{KEY_RECORD.itemsize} bytes"
        )
    records = np.frombuffer(data, dtype=KEY_RECORD)
    if len(records) and bool((records["hash"][1:] < records["hash"][:-1]).any()):
        raise ShardFormatError(f"{source}: key hashes are not sorted")
    if len(records) and int(records["pos"].max()) >= num_samples:
        raise ShardFormatError(f"{source}: a position is past the shard's {num_samples} samples")
    return records


def positions_of(records: np.ndarray, key: str) -> list[int]:
    """The positions whose key hashes like ``key`` (usually one; none when absent)."""
    h = np.uint64(key_hash(key))
    lo = int(np.searchsorted(records["hash"], h, side="left"))
    hi = int(np.searchsorted(records["hash"], h, side="right"))
    return [int(p) for p in records["pos"][lo:hi]]
