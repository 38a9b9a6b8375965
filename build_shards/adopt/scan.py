"""One pass over a WebDataset tar for ``adopt``: sample offsets (where each sample's header chain
starts), extension sets, ``.npy`` headers, key hashes and the file's SHA-256; and the scan of
many shards in processes or threads."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdsloader.errors import ShardFormatError
from wdsloader.format import iter_samples, padded, read_npy_header
from wdsloader.format.keyindex import key_hash
from wdsloader.format.keys import skip_reason
from wdsloader.io.storage import is_local

NpyInfo = tuple[str | None, tuple[int, ...] | None]
MAX_SKIPPED_EXAMPLES = 20


def merge_info(a: NpyInfo, b: NpyInfo) -> NpyInfo:
    return (a[0] if a[0] == b[0] else None, a[1] if a[1] == b[1] else None)


@dataclass(slots=True, kw_only=True)
class ShardScan:
    """What one pass over a tar found (everything the idx and the manifest need)."""

    path: str
    offsets: np.ndarray
    num_bytes: int
    sha256: str
    ext_sets: dict[tuple[str, ...], list[Any]] = field(default_factory=dict)
    """Each distinct set of extensions, in order of appearance: ``[count, first key]``."""
    npy: dict[str, NpyInfo] = field(default_factory=dict)
    """``(dtype, shape)`` of each npy extension; either is None where samples disagree."""
    layout: dict[str, list[int]] | None = None
    key_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    """Each sample's key hash (:func:`wdsloader.format.keyindex.key_hash`): the key index, and
    to find keys that two shards share."""
    num_skipped: int = 0
    """Regular members that are no sample member (metadata, no extension, hidden)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """The first few of them: ``(member name, why it was skipped)``."""

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1


# -- scanning one tar ----------------------------------------------------------------------------
def _npy_info(view: memoryview, off: int, size: int, source: str, key: str, ext: str) -> NpyInfo:
    """``(dtype, shape)`` from the header of an ``.npy`` member; object arrays are refused."""
    try:
        dtype, shape, _, _ = read_npy_header(view[off : off + size])
    except ValueError as exc:
        where = f"{source}: sample {key!r} field {ext!r}"
        raise ShardFormatError(f"{where}: bad .npy member ({exc})") from None
    if dtype.hasobject:
        raise ShardFormatError(
            f"{source}: member '{key}.{ext}' is an .npy array of dtype {dtype} (Python "
            "objects): object arrays are pickles, which the loader decodes only with "
            "allow_pickle=True (trusted data) and a manifest's schema cannot declare; store "
            "numeric arrays (or the values in another encoding, e.g. .json) and adopt again"
        )
    native = dtype.byteorder in "=|" and not dtype.fields
    return (dtype.name if native else dtype.str, tuple(shape))


def scan_buffer(buf: bytes | memoryview | mmap.mmap, *, path: str, source: str) -> ShardScan:
    """Scan a whole tar held in ``buf``: sample offsets, extension sets, npy headers, layout.

    ``path`` is recorded in the result, ``source`` names the shard in errors.
    """
    view = memoryview(buf)
    try:
        return _scan_view(view, path=path, source=source)
    finally:
        view.release()


def _scan_view(view: memoryview, *, path: str, source: str) -> ShardScan:
    offsets: list[int] = []
    scan = ShardScan(path=path, offsets=np.zeros(1, np.int64), num_bytes=len(view), sha256="")
    ext_sets = scan.ext_sets
    npy: dict[str, NpyInfo] = {}
    by_header: dict[bytes, NpyInfo] = {}  # the (dtype, shape) of each distinct .npy header
    layout: dict[str, tuple[int, int]] | None = None
    first_at: dict[str, int] = {}  # key -> offset of its sample
    hashes: list[int] = []
    fields: dict[str, tuple[int, int]] = {}

    def skipped(name: str, at: int) -> None:
        scan.num_skipped += 1
        if len(scan.skipped) < MAX_SKIPPED_EXAMPLES:
            scan.skipped.append((name, skip_reason(name)))

    # a sample starts at its first member's header chain (PAX / GNU long name included)
    for key, start, fields in iter_samples(view, source=source, on_skip=skipped, refuse_links=True):
        if key in first_at:
            raise ShardFormatError(
                f"{source}: sample key {key!r} appears twice (samples at bytes {first_at[key]} "
                f"and {start}): readers would deliver it twice per epoch"
            )
        first_at[key] = start
        hashes.append(key_hash(key))
        offsets.append(start)
        exts = tuple(fields)
        seen = ext_sets.get(exts)
        if seen is None:
            ext_sets[exts] = [1, key]
        else:
            seen[0] += 1
        layout = _same_place(layout, fields, start)
        for ext, (off, size) in fields.items():
            if ext == "npy" or ext.endswith(".npy"):
                head = _npy_header_bytes(view, off, size)
                info = by_header.get(head) if head is not None else None
                if info is None:
                    info = _npy_info(view, off, size, source, key, ext)
                    if head is not None:
                        by_header[head] = info
                known = npy.get(ext)
                if known != info:
                    npy[ext] = info if known is None else merge_info(known, info)
    # members only move forward: the last sample's last member ends the samples
    offsets.append(max((off + padded(size) for off, size in fields.values()), default=0))
    scan.offsets = np.asarray(offsets, dtype=np.int64)
    scan.key_hashes = np.asarray(hashes, dtype=np.uint64)
    scan.npy = npy
    scan.layout = None if layout is None else {k: list(v) for k, v in layout.items()}
    scan.sha256 = hashlib.sha256(view).hexdigest()
    return scan


def _same_place(
    layout: dict[str, tuple[int, int]] | None, fields: dict[str, tuple[int, int]], start: int
) -> dict[str, tuple[int, int]]:
    """The members of ``layout`` that sit at the same offset from ``start`` with the same size
    in ``fields`` (all of ``fields`` for the first sample)."""
    if layout is None:
        return {ext: (off - start, size) for ext, (off, size) in fields.items()}
    for ext, (rel, size) in layout.items():
        got = fields.get(ext)
        if got is None or got[0] - start != rel or got[1] != size:
            break
    else:
        return layout
    return {
        ext: place
        for ext, place in layout.items()
        if (got := fields.get(ext)) is not None and (got[0] - start, got[1]) == place
    }


def _npy_header_bytes(view: memoryview, off: int, size: int) -> bytes | None:
    """The bytes of an ``.npy`` member's header (magic, version, length, text): all that
    :func:`_npy_info` reads; None where they are not there (:func:`_npy_info` says why)."""
    if size < 12:
        return None
    major = view[off + 6]
    if major == 1:
        end = 10 + (view[off + 8] | view[off + 9] << 8)
    elif major in (2, 3):
        end = 12 + int.from_bytes(view[off + 8 : off + 12], "little")
    else:
        return None
    return bytes(view[off : off + end]) if end <= size else None


@contextmanager
def open_buffer(fs: Any, path: str) -> Iterator[bytes | mmap.mmap]:
    """The bytes of a file: memory-mapped (read-only) when local, else read whole."""
    if not is_local(fs):
        yield fs.cat_file(path)
        return
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm
        finally:
            try:
                mm.close()
            except BufferError:  # an error's traceback still holds a view; GC closes the map
                pass


def scan_file(fs: Any, path: str, rel: str, source: str) -> ShardScan:
    with open_buffer(fs, path) as buf:
        return scan_buffer(buf, path=rel, source=source)


def _scan_local(job: tuple[str, str, str]) -> ShardScan:
    """Process-pool entry point: scan a local file."""
    from fsspec.implementations.local import LocalFileSystem

    path, rel, source = job
    return scan_file(LocalFileSystem(), path, rel, source)


def scan_all(
    fs: Any,
    jobs: list[tuple[str, str, str]],
    display: str,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> list[ShardScan]:
    total = len(jobs)
    results: list[ShardScan] = []
    if workers == 1 or total == 1:
        for _, full, rel in jobs:
            results.append(scan_file(fs, full, rel, f"{display}/{rel}"))
            if progress is not None:
                progress(len(results), total)
        return results
    executor: Executor
    if is_local(fs):
        executor = ProcessPoolExecutor(max_workers=min(workers, total))
        mapped = executor.map(
            _scan_local, [(full, rel, f"{display}/{rel}") for _, full, rel in jobs]
        )
    else:
        executor = ThreadPoolExecutor(max_workers=min(workers, total))
        mapped = executor.map(
            lambda job: scan_file(fs, job[1], job[2], f"{display}/{job[2]}"), jobs
        )
    with executor:
        for scan in mapped:
            results.append(scan)
            if progress is not None:
                progress(len(results), total)
    return results
