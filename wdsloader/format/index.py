"""The index sidecar of a shard: little-endian uint64[n + 1], each sample's first header offset,
then the offset where the last sample ends (the start of the end-of-archive blocks).

The index of ``DIR/X.tar`` is the hidden file ``DIR/.X.tar.wdsidx`` (:func:`index_path`): a name
no other tool writes or reads. Hugging Face ``datasets`` takes every visible file with a ``.tar``
part in its name for an archive and ignores hidden ones, and Megatron-Energon keeps its own,
different index at ``X.tar.idx``. Datasets written by earlier versions (index ``X.tar.idx``)
still read: readers take the index path the manifest records, never a name derived here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from wdsloader.errors import ShardFormatError
from wdsloader.format.keys import split_name
from wdsloader.format.members import iter_members

INDEX_PREFIX = "."
INDEX_SUFFIX = ".wdsidx"
INDEX_DTYPE = np.dtype("<u8")


def index_path(shard_path: str) -> str:
    """Path of the index beside a shard: ``a/b/X.tar`` -> ``a/b/.X.tar.wdsidx``."""
    head, sep, name = shard_path.rpartition("/")
    return f"{head}{sep}{INDEX_PREFIX}{name}{INDEX_SUFFIX}"


def encode_index(offsets: np.ndarray | list[int]) -> bytes:
    """Bytes of an index file for ``offsets`` (n + 1 values, non-decreasing)."""
    arr = np.asarray(offsets, dtype=INDEX_DTYPE)
    if arr.ndim != 1 or arr.size < 1 or np.any(np.diff(arr.astype(np.int64)) < 0):
        raise ValueError("index offsets must be a non-empty non-decreasing 1-D sequence")
    return arr.tobytes()


def decode_index(data: bytes, *, source: str = "<index>") -> np.ndarray:
    """Offsets (int64) from the bytes of an index file."""
    if len(data) % 8 or len(data) < 8:
        raise ShardFormatError(f"{source}: index size {len(data)} is not a positive multiple of 8")
    arr = np.frombuffer(data, dtype=INDEX_DTYPE).astype(np.int64)
    if np.any(np.diff(arr) <= 0):
        raise ShardFormatError(f"{source}: index offsets are not strictly increasing")
    return arr


def iter_samples(
    buf: bytes | memoryview,
    *,
    source: str = "<shard>",
    on_skip: Callable[[str, int], None] | None = None,
    refuse_links: bool = False,
) -> Iterator[tuple[str, int, dict[str, tuple[int, int]]]]:
    """Samples of a whole tar in ``buf``: ``(key, first_header_offset, {ext: (data_off, size)})``.

    Consecutive members with the same key form a sample (the webdataset rule); a repeated
    extension within a sample is an error naming the shard and key. Regular members that are no
    sample member (:func:`~wdsloader.format.keys.split_name`) are skipped, each reported to
    ``on_skip(name, header_offset)`` when given. ``refuse_links``: a hard link or symlink
    named as a sample member is an error naming it (see :func:`iter_members`).
    """
    key: str | None = None
    start = 0
    fields: dict[str, tuple[int, int]] = {}
    for member in iter_members(buf, source=source, refuse_links=refuse_links):
        parts = split_name(member.name)
        if parts is None:
            if on_skip is not None:
                on_skip(member.name, member.header_offset)
            continue
        mkey, ext = parts
        if mkey != key:
            if key is not None:
                yield key, start, fields
            key, start, fields = mkey, member.header_offset, {}
        if ext in fields:
            raise ShardFormatError(f"{source}: sample {key!r} has the extension {ext!r} twice")
        fields[ext] = (member.data_offset, member.size)
    if key is not None:
        yield key, start, fields


def scan_tar(buf: bytes | memoryview, *, source: str = "<shard>") -> tuple[np.ndarray, list[str]]:
    """Index offsets and keys of every sample in a whole tar held in ``buf``."""
    offsets: list[int] = []
    keys: list[str] = []
    last_end = 0
    for key, start, fields in iter_samples(buf, source=source):
        offsets.append(start)
        keys.append(key)
        last_end = max(off + ((size + 511) // 512) * 512 for off, size in fields.values())
    offsets.append(last_end)
    return np.asarray(offsets, dtype=np.int64), keys
