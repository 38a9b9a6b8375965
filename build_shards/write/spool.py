"""Blocks the parent reads (in-memory and sequential sources) on their way to worker processes:
their array and bytes fields go through a file the worker maps, not through pickle."""

from __future__ import annotations

import itertools
import math
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import numpy as np

from build_shards.write.paths import BUILD_DIR, remove_quietly
from wdsloader.io.storage import is_local, join

_SPOOL_ALIGN = 64  # byte alignment of each array column in a spool file
MIN_BLOB_BYTES = 1 << 20  # bytes a block's values of a bytes field must reach to be spooled
_WRITEV_MAX = 64  # blobs per writev call (IOV_MAX is at least 1024 on Linux and macOS)


@dataclass(frozen=True, slots=True)
class _Column:
    """Where one stacked array field lies in a spool file."""

    offset: int
    dtype: np.dtype[Any]  # the dtype itself: it pickles exactly (byte order, record fields)
    shape: tuple[int, ...]


class SpooledItems:
    """A block of items the parent read (in-memory or sequential source), for a worker process.

    Pickling dicts of many small numpy arrays through the pool's pipe cost more than building
    their shards (each array is reduced, copied several times into fresh memory and rebuilt). So
    when every item of the block is a dict with the same names in the same order, each field
    whose values are all plain numpy arrays of one dtype and shape is written, one value after
    the other, to a temporary file; the worker maps that file (copy-on-write) and gets the
    values back as rows of one array per field. A field whose values are all ``bytes`` is
    written the same way, one value after the other, with their lengths (the worker gets each
    value back as ``bytes``): pickling big blobs through the pipe cost several copies each.
    Other fields travel pickled, as lists.

    Iterating gives ``(index, dict)`` pairs equal to the original items. The worker removes the
    file as soon as it has mapped it; the object the parent made removes it when it is
    garbage-collected (after the worker ran the block, or when the block was cancelled).
    """

    def __init__(
        self,
        indices: list[int],
        names: tuple[str, ...],
        arrays: dict[str, _Column],
        blobs: dict[str, _Blobs],
        others: dict[str, list[Any]],
        path: str,
    ) -> None:
        self.indices, self.names, self.path = indices, names, path
        self.arrays, self.blobs, self.others = arrays, blobs, others
        self._cleanup = weakref.finalize(self, remove_quietly, path)

    def __getstate__(self) -> dict[str, Any]:
        names = ("indices", "names", "arrays", "blobs", "others", "path")
        return {k: getattr(self, k) for k in names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # no cleanup here: the worker removes the file once mapped

    def __len__(self) -> int:
        return len(self.indices)

    def _map(self) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        remove_quietly(self.path)  # the mapping keeps the data
        n = len(self.indices)
        stacked: dict[str, Any] = {}
        for name, col in self.arrays.items():
            flat = np.frombuffer(mapped, col.dtype, n * math.prod(col.shape), col.offset)
            stacked[name] = flat.reshape(n, *col.shape)
        for name, blob in self.blobs.items():
            stacked[name] = _BlobColumn(mapped, blob)
        return stacked

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        stacked = self._map()
        columns: list[Iterable[Any]] = []
        for name in self.names:
            if name in self.arrays:
                columns.append(list(stacked[name]))  # the row views, made in one C loop
            elif name in self.blobs:
                columns.append(iter(stacked[name]))
            else:
                columns.append(self.others[name])
        names = self.names
        for index, row in zip(self.indices, zip(*columns, strict=True), strict=True):
            yield index, dict(zip(names, row, strict=True))


@dataclass(frozen=True, slots=True)
class _Blobs:
    """Where one bytes field lies in a spool file: its values one after the other."""

    offset: int
    lengths: list[int]


class _BlobColumn:
    """The values of a bytes field in a mapped spool file, by row (each a fresh ``bytes``)."""

    def __init__(self, mapped: mmap.mmap, blobs: _Blobs) -> None:
        self.mapped = mapped
        self.starts = list(itertools.accumulate(blobs.lengths, initial=blobs.offset))

    def __getitem__(self, row: int) -> bytes:
        return self.mapped[self.starts[row] : self.starts[row + 1]]

    def __iter__(self) -> Iterator[bytes]:
        mapped = self.mapped
        for start, stop in itertools.pairwise(self.starts):
            yield mapped[start:stop]


def _is_blob_column(values: list[Any]) -> bool:
    """True when ``values`` are all ``bytes`` and big enough together to be worth a file."""
    return all(type(v) is bytes for v in values) and sum(map(len, values)) >= MIN_BLOB_BYTES


def _is_column(values: list[Any]) -> bool:
    """True when ``values`` are plain numpy arrays (not 0-d, not object) of one dtype and shape,
    with data."""
    first = values[0]
    if type(first) is not np.ndarray or first.dtype.hasobject or first.ndim == 0:
        return False
    dtype, shape = first.dtype, first.shape
    return first.nbytes > 0 and all(
        type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in values
    )


def _write_columns(
    f: BinaryIO, columns: dict[str, list[np.ndarray]], blobs: dict[str, list[bytes]]
) -> tuple[dict[str, _Column], dict[str, _Blobs]]:
    offset = 0
    placed: dict[str, _Column] = {}
    for name, values in columns.items():
        pad = -offset % _SPOOL_ALIGN
        f.write(bytes(pad))
        offset += pad
        first = values[0]
        placed[name] = _Column(offset, first.dtype, first.shape)
        for v in values:
            # an array is a buffer (numpy's stubs do not say so)
            f.write(cast(bytes, v if v.flags.c_contiguous else np.ascontiguousarray(v)))
        offset += first.nbytes * len(values)
    placed_blobs: dict[str, _Blobs] = {}
    f.flush()  # the blobs go last, straight to the file: not copied into the buffer first
    for name, data in blobs.items():
        lengths = [len(blob) for blob in data]
        placed_blobs[name] = _Blobs(offset, lengths)
        _write_all(f.fileno(), data)
        offset += sum(lengths)
    return placed, placed_blobs


def _write_all(fd: int, blobs: list[bytes]) -> None:
    """Write ``blobs`` one after the other at the file's position, a few at a time."""
    for start in range(0, len(blobs), _WRITEV_MAX):
        chunk = blobs[start : start + _WRITEV_MAX]
        done, total = os.writev(fd, chunk), sum(map(len, chunk))
        if done < total:  # a short write: the rest one by one
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def spool_items(
    items: Iterable[tuple[int, Any]], fs: Any = None, root: str | None = None
) -> list[tuple[int, Any]] | SpooledItems:
    """A block of items the parent read, made ready to send to a worker process: a
    :class:`SpooledItems` when its items are dicts of one set of names with array fields, else
    the ``(index, item)`` list.

    The spool file goes under the output's ``_build/`` when the output (``fs``, ``root``) is
    local, so whatever a killed build leaves there goes with the rest of its state; else in the
    system's temporary folder.
    """
    pairs = list(items)
    raws = [raw for _, raw in pairs]
    if not raws or any(type(raw) is not dict for raw in raws):
        return pairs
    names = tuple(raws[0])
    if any(len(raw) != len(names) or tuple(raw) != names for raw in raws):
        return pairs
    by_name = {name: [raw[name] for raw in raws] for name in names}
    arrays = {name: values for name, values in by_name.items() if _is_column(values)}
    blobs = {
        name: values
        for name, values in by_name.items()
        if name not in arrays and _is_blob_column(values)
    }
    if not arrays and not blobs:
        return pairs
    folder = None
    if fs is not None and root is not None and is_local(fs):
        folder = join(root, BUILD_DIR)
        os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="spool-", dir=folder)
    try:
        with open(fd, "wb", buffering=1 << 20) as f:
            placed, placed_blobs = _write_columns(f, arrays, blobs)
    except BaseException:
        remove_quietly(path)
        raise
    others = {
        name: values for name, values in by_name.items() if name not in arrays and name not in blobs
    }
    return SpooledItems([index for index, _ in pairs], names, placed, placed_blobs, others, path)
