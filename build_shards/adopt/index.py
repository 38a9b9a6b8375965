"""Adopt WebDataset shards written by other tools: scan each tar once, write its index and key index
beside it (the hidden ``.X.tar.wdsidx`` and ``.X.tar.wdskeys``), a ``manifest.json`` and a
dataset card at the root. The tars themselves are only read, never modified, and so is any other
tool's file (Energon's ``X.tar.idx``, a user's ``README.md``).

Sample offsets follow the WebDataset grouping rule (consecutive members with the same key form a
sample). A sample's offset is where its *header chain* starts: the PAX (``x``) or GNU long-name
(``L``) header that precedes the member when there is one, as Python's ``tarfile`` and NVIDIA
Energon count it. A reader that starts there sees the member's full name; webdataset's
``ShardWriter`` writes such a PAX header before every member.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NoReturn

import numpy as np

from build_shards.adopt.lengths import add_lengths, record_lengths
from build_shards.adopt.scan import NpyInfo, ShardScan, merge_info, open_buffer, scan_all
from build_shards.commit.card import write_card
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
)
from wdsloader.format.keyindex import hash_records, key_hash, keys_path
from wdsloader.io.manifest_io import save_manifest
from wdsloader.io.setup_errors import setup_errors_in_one_line
from wdsloader.io.storage import join, url_to_fs, write_atomic

logger = logging.getLogger(__name__)

COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4")
SPLIT_ORDER = ("train", "validation", "val", "valid", "dev", "test")
_MAX_EXAMPLES = 20
_DEFAULT_SPLIT = "train"


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
            merged[ext] = merge_info(merged.get(ext, info), info)
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
        with open_buffer(fs, full_paths[scan.path]) as buf:
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
    lengths: str | None = None,
) -> Manifest:
    """Index the WebDataset tars under ``root`` (a folder or fsspec URL) and write a manifest.

    Every ``*.tar`` under ``root`` (recursively; names starting with ``.`` are skipped) is
    scanned once; its index ``.X.tar.wdsidx`` and key index ``.X.tar.wdskeys`` are written
    atomically beside it, then ``manifest.json``, then the dataset card ``README.md`` (see
    :mod:`build_shards.commit.card`).
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
    per epoch), a sparse member (GNU tar ``-S``, bsdtar), a hard link or symlink named as a
    sample member, an object-dtype ``.npy`` member (a pickle); the message names the files, the
    key or member and the byte offset. Nothing is written before every shard passed. Members
    that are no sample member (webdataset's metadata names ``__NAME__``, names without an
    extension, hidden names) are skipped and listed in ``manifest.build["skipped_members"]``.
    An existing manifest without ``overwrite`` raises ``FileExistsError``, unless ``lengths``
    is given: then only the lengths are added (:func:`~build_shards.adopt.lengths.add_lengths`).
    ``lengths`` (a field name) records each sample's length of that field beside its shard.
    ``workers > 1`` scans local shards in processes (threads for remote filesystems).
    ``progress(done, total)`` is called after each shard.
    """
    display = os.fspath(root).rstrip("/")
    fs, base = url_to_fs(root, storage_options)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    pattern = _compile_pattern(splits) if splits is not None else None
    with setup_errors_in_one_line(display, storage_options, fs=fs):  # adopt's first look
        exists = fs.exists(join(base, MANIFEST_NAME)) and not overwrite
        if exists and lengths is not None:  # an indexed dataset: add its lengths only
            return add_lengths(root, lengths, storage_options=storage_options)
        if exists:
            raise FileExistsError(
                f"{display}/{MANIFEST_NAME} already exists: pass overwrite=True (--overwrite) to "
                "adopt again"
            )
        layout = find_shards(fs, base, display, pattern)
    jobs = [(split, full, rel) for split, items in layout.items() for full, rel in items]
    total = len(jobs)
    scans = scan_all(fs, jobs, display, workers, progress)

    by_split, empty = _by_split(jobs, scans, display)
    full_paths = {rel: full for _, full, rel in jobs}
    for split, group in by_split.items():
        _check_duplicate_keys(fs, split, group, full_paths, display)
    manifest = _new_manifest(by_split, display, strict, infer_schema, pattern, empty)
    _record_skipped(manifest, scans, display)
    for split, group in by_split.items():
        manifest.splits[split] = _write_indexes(fs, base, group)
    try:
        manifest.check_paths()
    except ManifestError as exc:  # a shard path the manifest cannot hold (e.g. '..')
        raise ShardFormatError(str(exc)) from None
    if lengths is not None:
        record_lengths(fs, base, display, manifest, lengths)
    save_manifest(manifest, root, storage_options)
    write_card(fs, base, display, manifest, {rel: split for split, _, rel in jobs})
    logger.info(
        "adopted %d shards, %d samples under %s", total - len(empty), manifest.num_samples, display
    )
    return manifest


def _new_manifest(
    by_split: dict[str, list[ShardScan]],
    display: str,
    strict: bool,
    infer_schema: bool,
    pattern: re.Pattern[str] | None,
    empty: list[str],
) -> Manifest:
    """The manifest of an adoption, before its splits: the schema and the ``build`` record (how
    splits were found, the empty shards, the samples with other extensions); samples with
    other extensions refused when ``strict``."""
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
    return manifest


def _record_skipped(manifest: Manifest, scans: list[ShardScan], display: str) -> None:
    """Record in ``manifest.build["skipped_members"]`` the members that are no sample member
    (what webdataset skips too: metadata names, names without an extension, hidden names)."""
    total = sum(scan.num_skipped for scan in scans)
    if not total:
        return
    examples = [
        {"shard": scan.path, "member": name, "why": why}
        for scan in scans
        for name, why in scan.skipped
    ][:_MAX_EXAMPLES]
    manifest.build["skipped_members"] = {"num_members": total, "examples": examples}
    first = examples[0]
    logger.warning(
        "%s: %d tar members are no sample member and were skipped, e.g. %s/%s member %r: %s",
        display,
        total,
        display,
        first["shard"],
        first["member"],
        first["why"],
    )


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
    """Write each shard's index and key index; the split's entry in the manifest."""
    info = SplitInfo()
    for scan in group:
        rel_idx, rel_keys = index_path(scan.path), keys_path(scan.path)
        write_atomic(fs, join(base, rel_idx), encode_index(scan.offsets))
        write_atomic(fs, join(base, rel_keys), hash_records(scan.key_hashes.tolist()).tobytes())
        info.shards.append(
            ShardInfo(
                path=scan.path,
                idx_path=rel_idx,
                keys_path=rel_keys,
                num_samples=scan.num_samples,
                num_bytes=scan.num_bytes,
                sha256=scan.sha256,
                layout=scan.layout or None,
            )
        )
    return info
