"""Adopt WebDataset shards written by other tools: scan each tar once, write ``X.tar.idx`` beside
it and a ``manifest.json`` at the root. The tars themselves are only read, never modified.

Sample offsets follow the WebDataset grouping rule (consecutive members with the same key form a
sample). A sample's offset is where its *header chain* starts: the PAX (``x``) or GNU long-name
(``L``) header that precedes the member when there is one, as Python's ``tarfile`` and NVIDIA
Energon count it. A reader that starts there sees the member's full name; webdataset's
``ShardWriter`` writes such a PAX header before every member.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import posixpath
import re
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NoReturn

import numpy as np

from wdsloader.errors import ManifestError, ShardFormatError
from wdsloader.format import (
    MANIFEST_NAME,
    FieldSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    encode_index,
    field_of_ext,
    index_path,
    iter_samples,
    padded,
    read_npy_header,
)
from wdsloader.io.storage import is_local, join, url_to_fs, write_atomic

logger = logging.getLogger(__name__)

COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4")
SPLIT_ORDER = ("train", "validation", "val", "valid", "dev", "test")
_MAX_EXAMPLES = 20
_DEFAULT_SPLIT = "train"


NpyInfo = tuple[str | None, tuple[int, ...] | None]


def _merge_info(a: NpyInfo, b: NpyInfo) -> NpyInfo:
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
    """A 64-bit hash of each sample's key (to find keys that two shards share)."""

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1


# -- scanning one tar ----------------------------------------------------------------------------
def _npy_info(view: memoryview, off: int, size: int, where: str) -> NpyInfo:
    """``(dtype, shape)`` from the header of an ``.npy`` member."""
    try:
        dtype, shape, _, _ = read_npy_header(view[off : off + size])
    except ValueError as exc:
        raise ShardFormatError(f"{where}: bad .npy member ({exc})") from None
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


def key_hash(key: str) -> int:
    """A stable 64-bit hash of a sample key (the same in every process)."""
    raw = key.encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def _scan_view(view: memoryview, *, path: str, source: str) -> ShardScan:
    offsets: list[int] = []
    scan = ShardScan(path=path, offsets=np.zeros(1, np.int64), num_bytes=len(view), sha256="")
    npy: dict[str, Any] = {}
    layout: dict[str, list[int]] | None = None
    end = 0
    first_at: dict[str, int] = {}  # key -> offset of its sample
    hashes: list[int] = []
    # a sample starts at its first member's header chain (PAX / GNU long name included)
    for key, start, fields in iter_samples(view, source=source):
        if key in first_at:
            raise ShardFormatError(
                f"{source}: sample key {key!r} appears twice (samples at bytes {first_at[key]} "
                f"and {start}): readers would deliver it twice per epoch"
            )
        first_at[key] = start
        hashes.append(key_hash(key))
        offsets.append(start)
        exts = tuple(fields)
        seen = scan.ext_sets.get(exts)
        if seen is None:
            scan.ext_sets[exts] = [1, key]
        else:
            seen[0] += 1
        here = {ext: [off - start, size] for ext, (off, size) in fields.items()}
        if layout is None:
            layout = here
        else:
            layout = {k: v for k, v in layout.items() if here.get(k) == v}
        for ext, (off, size) in fields.items():
            end = max(end, off + padded(size))
            if ext == "npy" or ext.endswith(".npy"):
                where = f"{source}: sample {key!r} field {ext!r}"
                info = _npy_info(view, off, size, where)
                npy[ext] = _merge_info(npy.get(ext, info), info)
    offsets.append(end)
    scan.offsets = np.asarray(offsets, dtype=np.int64)
    scan.key_hashes = np.asarray(hashes, dtype=np.uint64)
    scan.npy = npy
    scan.layout = layout
    scan.sha256 = hashlib.sha256(view).hexdigest()
    return scan


@contextmanager
def _open_buffer(fs: Any, path: str) -> Iterator[bytes | mmap.mmap]:
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


def _scan_file(fs: Any, path: str, rel: str, source: str) -> ShardScan:
    with _open_buffer(fs, path) as buf:
        return scan_buffer(buf, path=rel, source=source)


def _scan_local(job: tuple[str, str, str]) -> ShardScan:
    """Process-pool entry point: scan a local file."""
    from fsspec.implementations.local import LocalFileSystem

    path, rel, source = job
    return _scan_file(LocalFileSystem(), path, rel, source)


# -- finding shards and their splits -------------------------------------------------------------
def _compile_pattern(splits: str | re.Pattern[str]) -> re.Pattern[str]:
    try:
        pattern = re.compile(splits) if isinstance(splits, str) else splits
    except re.error as exc:
        raise ValueError(f"invalid split pattern {splits!r}: {exc}") from None
    if "split" not in pattern.groupindex:
        raise ValueError(
            f"split pattern {pattern.pattern!r} has no named group 'split', e.g. "
            r"'(?P<split>train|val|test)-\d+\.tar'"
        )
    return pattern


def split_of(rel: str, pattern: re.Pattern[str] | None) -> str:
    """The split of a shard at ``rel`` (relative to the root).

    With a pattern: its ``split`` group, searched in the relative path (no match -> ValueError).
    Without: the first folder under the root, or ``"train"`` for shards at the root itself.
    """
    if pattern is not None:
        m = pattern.search(rel)
        if m is None or not m.group("split"):
            raise ValueError(f"shard {rel!r} does not match the split pattern {pattern.pattern!r}")
        return m.group("split")
    head, sep, _ = rel.partition("/")
    return head if sep else _DEFAULT_SPLIT


def _split_sort_key(name: str) -> tuple[int, str]:
    return (SPLIT_ORDER.index(name) if name in SPLIT_ORDER else len(SPLIT_ORDER), name)


def find_shards(
    fs: Any, base: str, display: str, pattern: re.Pattern[str] | None
) -> dict[str, list[tuple[str, str]]]:
    """``{split: [(full_path, relative_path), ...]}``, splits in the usual order, paths sorted."""
    if not fs.isdir(base):
        raise FileNotFoundError(f"{display}: no such folder")
    found: dict[str, list[tuple[str, str]]] = {}
    compressed: list[str] = []
    prefix = base.rstrip("/") + "/"
    for full in sorted(fs.find(base)):
        rel = full[len(prefix) :] if full.startswith(prefix) else posixpath.basename(full)
        name = posixpath.basename(rel)
        if name.startswith("."):
            continue
        if name.lower().endswith(COMPRESSED_SUFFIXES):
            compressed.append(rel)
        elif name.endswith(".tar"):
            found.setdefault(split_of(rel, pattern), []).append((full, rel))
    if compressed:
        raise ShardFormatError(
            f"{display}/{compressed[0]}: compressed tars are not supported: a compressed stream "
            f"has no byte offsets to index ({len(compressed)} found); decompress them first "
            "(e.g. `gunzip`) and adopt the plain .tar files"
        )
    if not found:
        raise FileNotFoundError(f"{display}: no .tar shards found (searched recursively)")
    return {k: found[k] for k in sorted(found, key=_split_sort_key)}


# -- schema --------------------------------------------------------------------------------------
_SCALAR_DTYPES = {"txt": "str", "text": "str", "cls": "int", "json": "json", "jsn": "json"}


def infer_schema_from(exts: tuple[str, ...], npy: dict[str, NpyInfo]) -> dict[str, FieldSpec]:
    """Fields of a sample with extensions ``exts``: name from the extension (``vec.npy`` ->
    ``vec``; the whole extension, dots as ``_``, when two would collide); npy dtype/shape when
    every sample agrees, else left open (None)."""
    names = [field_of_ext(ext)[0] for ext in exts]
    schema: dict[str, FieldSpec] = {}
    for ext, name in zip(exts, names, strict=True):
        encoding = field_of_ext(ext)[1]
        if names.count(name) > 1:
            name = ext.replace(".", "_")
        spec = FieldSpec(ext=ext, encoding=encoding, dtype=_SCALAR_DTYPES.get(encoding))
        if encoding == "npy":
            dtype, shape = npy.get(ext, (None, None))
            spec.dtype, spec.shape = dtype, list(shape) if shape is not None else None
        schema[name] = spec
    return schema


def _merge_npy(scans: list[ShardScan]) -> dict[str, NpyInfo]:
    merged: dict[str, NpyInfo] = {}
    for scan in scans:
        for ext, info in scan.npy.items():
            merged[ext] = _merge_info(merged.get(ext, info), info)
    return merged


def _heterogeneity(
    splits: dict[str, list[ShardScan]],
) -> tuple[tuple[str, ...] | None, str, list[dict[str, Any]], int]:
    """The reference extension set (first sample of the first shard), where it was seen,
    examples of samples whose set differs (first key per shard and set), and their count."""
    reference: tuple[str, ...] | None = None
    ref_where = ""
    examples: list[dict[str, Any]] = []
    count = 0
    for split, scans in splits.items():
        for scan in scans:
            for exts, (n, key) in scan.ext_sets.items():
                if reference is None:
                    reference, ref_where = exts, f"{scan.path} sample {key!r}"
                if sorted(exts) == sorted(reference):
                    continue
                count += n
                if len(examples) < _MAX_EXAMPLES:
                    examples.append(
                        {"split": split, "shard": scan.path, "key": key, "extensions": list(exts)}
                    )
    return reference, ref_where, examples, count


# -- keys shared by two shards -------------------------------------------------------------------
def _check_duplicate_keys(
    fs: Any, split: str, scans: list[ShardScan], full_paths: dict[str, str], display: str
) -> None:
    """ShardFormatError naming both shards when two shards of ``split`` hold the same key.

    Keys are compared by their 64-bit hashes; the shards whose hashes collide are read again to
    find the key itself (a mere hash collision passes).
    """
    if len(scans) < 2:
        return
    allh = np.concatenate([s.key_hashes for s in scans])
    owner = np.repeat(np.arange(len(scans)), [len(s.key_hashes) for s in scans])
    order = np.argsort(allh, kind="stable")
    same = allh[order][1:] == allh[order][:-1]
    if not same.any():
        return
    dup = set(allh[order][1:][same].tolist())
    suspects = sorted(set(owner[np.isin(allh, list(dup))].tolist()))
    holder: dict[str, str] = {}
    for i in suspects:
        scan = scans[i]
        with _open_buffer(fs, full_paths[scan.path]) as buf:
            view = memoryview(buf)
            try:
                source = f"{display}/{scan.path}"
                keys = [k for k, _, _ in iter_samples(view, source=source)]
            finally:
                view.release()
        for key in keys:
            if key_hash(key) not in dup:
                continue
            other = holder.setdefault(key, scan.path)
            if other != scan.path:
                raise ShardFormatError(
                    f"{display}/{other} and {display}/{scan.path} both hold sample {key!r} "
                    f"(split {split!r}): readers would deliver it twice per epoch; remove or "
                    "rename one of them"
                )


# -- adopt ---------------------------------------------------------------------------------------
def adopt(
    root: str | os.PathLike[str],
    *,
    splits: str | re.Pattern[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    infer_schema: bool = True,
    strict: bool = True,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Index the WebDataset tars under ``root`` (a folder or fsspec URL) and write a manifest.

    Every ``*.tar`` under ``root`` (recursively; names starting with ``.`` are skipped) is
    scanned once; ``X.tar.idx`` is written atomically beside it, then ``manifest.json`` last.
    Splits: ``splits`` is a regex with a named group ``split`` searched in each shard's path
    relative to ``root`` (e.g. ``r"(?P<split>train|val|test)-\\d+\\.tar"``); without it the
    first folder under ``root`` names the split and shards at the root are ``"train"``. Shards
    are sorted by path within a split. The schema comes from the first sample (``infer_schema``);
    ``.npy`` fields get dtype and shape from their headers when every sample agrees.

    Every sample must carry the same set of extensions (WebDataset readers expect it): with
    ``strict`` a difference raises ``ShardFormatError`` naming the shard and key; with
    ``strict=False`` it is recorded in ``manifest.build["heterogeneous"]``. Compressed tars
    raise ``ShardFormatError`` (no byte offsets), and so do shards readers would misread: a
    member whose data would end past the end of its file (a corrupt size, e.g. in a PAX
    record), a key twice in one shard, a key in two shards of one split (each delivered twice
    per epoch); the message names the files, the key or member and the byte offset. Nothing is
    written before every shard passed. An existing manifest without ``overwrite``
    raises ``FileExistsError``. ``workers > 1`` scans local shards in processes (threads for
    remote filesystems). ``progress(done, total)`` is called after each shard.
    """
    display = os.fspath(root).rstrip("/")
    fs, base = url_to_fs(root, storage_options)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    pattern = _compile_pattern(splits) if splits is not None else None
    if fs.exists(join(base, MANIFEST_NAME)) and not overwrite:
        raise FileExistsError(
            f"{display}/{MANIFEST_NAME} already exists: pass overwrite=True (--overwrite) to "
            "adopt again"
        )
    layout = find_shards(fs, base, display, pattern)
    jobs = [(split, full, rel) for split, items in layout.items() for full, rel in items]
    total = len(jobs)
    scans = _scan_all(fs, jobs, display, workers, progress)

    by_split, empty = _by_split(jobs, scans, display)
    full_paths = {rel: full for _, full, rel in jobs}
    for split, group in by_split.items():
        _check_duplicate_keys(fs, split, group, full_paths, display)

    reference, ref_where, examples, n_odd = _heterogeneity(by_split)
    if examples and strict:
        _refuse_heterogeneous(display, examples[0], reference, ref_where, n_odd)
    all_scans = [s for group in by_split.values() for s in group]
    schema = infer_schema_from(reference or (), _merge_npy(all_scans)) if infer_schema else {}

    manifest = Manifest(
        schema=schema,
        build={
            "adopted": True,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "split_rule": f"pattern {pattern.pattern}" if pattern is not None else "folders",
        },
    )
    if empty:
        manifest.build["empty_shards"] = empty
    if examples:
        manifest.build["heterogeneous"] = {"num_samples": n_odd, "examples": examples}
    for split, group in by_split.items():
        manifest.splits[split] = _write_indexes(fs, base, group)
    try:
        manifest.check_paths()
    except ManifestError as exc:  # a shard path the manifest cannot hold (e.g. '..')
        raise ShardFormatError(str(exc)) from None
    manifest.save(root, storage_options)
    logger.info(
        "adopted %d shards, %d samples under %s", total - len(empty), manifest.num_samples, display
    )
    return manifest


def _by_split(
    jobs: list[tuple[str, str, str]], scans: list[ShardScan], display: str
) -> tuple[dict[str, list[ShardScan]], list[str]]:
    """The scans with samples per split, in order, and the paths of the empty shards."""
    by_split: dict[str, list[ShardScan]] = {}
    empty: list[str] = []
    for (split, _, _), scan in zip(jobs, scans, strict=True):
        if scan.num_samples == 0:
            empty.append(scan.path)
            logger.warning("%s/%s: no samples, left out of the manifest", display, scan.path)
            continue
        by_split.setdefault(split, []).append(scan)
    if not by_split:
        raise ShardFormatError(f"{display}: the {len(jobs)} tar files hold no samples")
    return by_split, empty


def _refuse_heterogeneous(
    display: str,
    first: dict[str, Any],
    reference: tuple[str, ...] | None,
    ref_where: str,
    n_odd: int,
) -> NoReturn:
    """The error for a sample whose fields differ from the first sample's (``strict``)."""
    raise ShardFormatError(
        f"{display}/{first['shard']}: sample {first['key']!r} has the fields "
        f"{sorted(first['extensions'])} but {ref_where} has {sorted(reference or ())}: "
        f"WebDataset readers expect every sample to carry the same fields ({n_odd} samples "
        "differ; strict=False records them instead)"
    )


def _write_indexes(fs: Any, base: str, group: list[ShardScan]) -> SplitInfo:
    """Write each shard's ``.tar.idx``; the split's entry in the manifest."""
    info = SplitInfo()
    for scan in group:
        rel_idx = index_path(scan.path)
        write_atomic(fs, join(base, rel_idx), encode_index(scan.offsets))
        info.shards.append(
            ShardInfo(
                path=scan.path,
                idx_path=rel_idx,
                num_samples=scan.num_samples,
                num_bytes=scan.num_bytes,
                sha256=scan.sha256,
                layout=scan.layout or None,
            )
        )
    return info


def _scan_all(
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
            results.append(_scan_file(fs, full, rel, f"{display}/{rel}"))
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
            lambda job: _scan_file(fs, job[1], job[2], f"{display}/{job[2]}"), jobs
        )
    with executor:
        for scan in mapped:
            results.append(scan)
            if progress is not None:
                progress(len(results), total)
    return results
