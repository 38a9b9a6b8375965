"""The lengths of a shard's samples: one ``uint32`` per sample, in order, the length of the
field the build declared (``samples=SampleOptions(lengths="input_ids")``), so that a plan can pack
sequences or count tokens without reading a sample.

Bytes: little-endian ``uint32``, one per sample, in a hidden file beside the shard
(``a/b/.X.tar.wdslen``, :func:`lengths_path`), listed as ``ShardInfo.lengths_path``; the field
they measure is ``manifest.build["lengths_field"]`` (:data:`LENGTHS_FIELD`), their sha256
``ShardInfo.lengths_sha256`` (checked when read, :func:`lengths_sha256`). A sample's length is
that of the first dimension of its array or list, or of its str (characters) or bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wdsloader.errors import ShardFormatError

LENGTHS_SUFFIX = ".wdslen"
LENGTH_DTYPE = np.dtype("<u4")
LENGTHS_FIELD = "lengths_field"  # the manifest.build entry naming the measured field
MAX_LENGTH = (1 << 32) - 1


class _ShardPaths(Protocol):
    path: str
    num_samples: int
    lengths_path: str | None
    # and optionally ``lengths_sha256: str | None`` (read with getattr: checked when present)


def lengths_path(shard_path: str) -> str:
    """Path of the lengths beside a shard: ``a/b/X.tar`` -> ``a/b/.X.tar.wdslen``."""
    head, sep, name = shard_path.rpartition("/")
    return f"{head}{sep}.{name}{LENGTHS_SUFFIX}"


def sample_length(value: Any, *, key: str, field: str) -> int:
    """The length of one sample's ``field`` (see the module's text), or a ValueError naming the
    sample's key and the field."""
    where = f"sample {key!r}: lengths field {field!r}"
    if isinstance(value, str | bytes | bytearray | memoryview):
        n = len(value)
    elif isinstance(value, np.ndarray) or hasattr(value, "shape"):
        shape = tuple(value.shape)
        if not shape:
            raise ValueError(f"{where} is a 0-d array: it has no length")
        n = int(shape[0])
    elif isinstance(value, Sequence):
        n = len(value)
    else:
        raise ValueError(
            f"{where} is a {type(value).__qualname__}: lengths are of arrays, lists, str or bytes"
        )
    if n > MAX_LENGTH:
        raise ValueError(f"{where} has length {n}, more than the {MAX_LENGTH} a uint32 holds")
    return n


def field_length(sample: Mapping[str, Any], *, key: str, field: str) -> int:
    """:func:`sample_length` of ``sample[field]``; a sample without the field is a ValueError."""
    if field not in sample:
        raise ValueError(
            f"sample {key!r} has no field {field!r} (the lengths field); it has {sorted(sample)}"
        )
    return sample_length(sample[field], key=key, field=field)


def encode_lengths(lengths: Sequence[int]) -> bytes:
    """The bytes of a shard's lengths file."""
    return np.asarray(lengths, dtype=LENGTH_DTYPE).tobytes()


def lengths_sha256(data: bytes) -> str:
    """The checksum of a lengths file's bytes, as ``ShardInfo.lengths_sha256`` records it."""
    return hashlib.sha256(data).hexdigest()


def decode_lengths(
    data: bytes, num_samples: int, *, source: str = "<lengths>", sha256: str | None = None
) -> npt.NDArray[np.uint32]:
    """The lengths a lengths file holds (checked: one per sample, and its ``sha256`` when
    given); a ShardFormatError naming ``source`` otherwise."""
    if len(data) != num_samples * LENGTH_DTYPE.itemsize:
        raise ShardFormatError(
            f"{source}: {len(data)} bytes, expected {num_samples} lengths of "
            f"{LENGTH_DTYPE.itemsize} bytes (one per sample of the shard)"
        )
    if sha256 is not None and lengths_sha256(data) != sha256:
        raise ShardFormatError(
            f"{source}: sha256 {lengths_sha256(data)} differs from the manifest's {sha256} "
            "(the file was changed or damaged after the build; rebuild it with "
            "`build-shards adopt --lengths FIELD`)"
        )
    return np.frombuffer(data, dtype=LENGTH_DTYPE).astype(np.uint32)


def declared_lengths_path(shard: _ShardPaths) -> str:
    """The lengths file the manifest lists for ``shard`` (under the dataset root); a
    ShardFormatError naming the shard when it has none."""
    if shard.lengths_path is None:
        raise ShardFormatError(
            f"shard {shard.path}: no lengths in the manifest (build with "
            "samples=SampleOptions(lengths=FIELD), or add them to built shards with "
            "`build-shards adopt DATASET --lengths FIELD`)"
        )
    return shard.lengths_path


def missing_lengths(shard: _ShardPaths) -> ShardFormatError:
    """The error for a shard whose declared lengths file is absent."""
    return ShardFormatError(f"shard {shard.path}: its lengths file {shard.lengths_path} is missing")


def shard_lengths(data: bytes, shard: _ShardPaths) -> npt.NDArray[np.uint32]:
    """:func:`decode_lengths` of ``shard``'s lengths file (errors name the shard and file)."""
    return decode_lengths(
        data, shard.num_samples, source=f"shard {shard.path}: lengths {shard.lengths_path}",
        sha256=getattr(shard, "lengths_sha256", None),
    )  # fmt: skip


def read_lengths(fs: Any, root: str, shard: _ShardPaths) -> npt.NDArray[np.uint32]:
    """The lengths of ``shard``'s samples, read through ``fs`` (an fsspec filesystem: its
    ``cat_file``) under the dataset ``root``; a ShardFormatError naming the shard when it has
    none or its file is missing or of the wrong size. (A reader's side reads them through its
    store: :func:`wdsloader.io.side_files.read_lengths`.)"""
    path = f"{root.rstrip('/')}/{declared_lengths_path(shard)}"
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise missing_lengths(shard) from None
    return shard_lengths(data, shard)


def read_split_lengths(fs: Any, root: str, shards: Sequence[_ShardPaths]) -> npt.NDArray[np.uint32]:
    """The lengths of a split's samples indexed by global sample id (the shards' lengths
    concatenated in manifest order), as a plan reads them."""
    parts = [read_lengths(fs, root, shard) for shard in shards]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)
