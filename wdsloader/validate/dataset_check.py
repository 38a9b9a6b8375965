"""Check every shard of a dataset (files, sizes, indexes, checksums and, with ``deep=True``,
every sample against the schema), reporting every problem found instead of stopping at the first.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from wdsloader.curriculum.curriculum import stored_curriculum
from wdsloader.decode.parse import parse_sample
from wdsloader.decode.registry import SampleDecoder
from wdsloader.errors import WdsLoaderError
from wdsloader.format import FieldSpec, Manifest, ShardInfo
from wdsloader.format.deflate import inflate_sample
from wdsloader.format.index import INDEX_DTYPE
from wdsloader.format.ustar import BLOCK
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.io.manifest_io import cat_whole, load_manifest, manifest_where
from wdsloader.io.storage import join, url_to_fs
from wdsloader.progress import progress_bar
from wdsloader.validate.batch import (
    MANIFEST_DIMS,
    TENSOR,
    delivery_kind,
    expected_tail,
    first_value,
    list_out_of_range,
    min_max,
    nonfinite_mask,
    out_of_range,
    range_text,
    rows_of,
    shape_problem,
)

__all__ = ["ValidationReport", "validate_dataset"]

log = logging.getLogger(__name__)

MAX_LINES_PER_RULE = 10  # per shard, field and rule; the rest are counted in one line
CHUNK_SAMPLES = 4096
CHUNK_BYTES = 32 * 2**20


@dataclass(slots=True)
class ValidationReport:
    """What :func:`validate_dataset` found: one line per problem (empty when the data are clean).

    ``samples_checked`` counts the samples read and decoded with ``deep=True``, else the samples
    covered by the indexes checked.
    """

    problems: list[str] = field(default_factory=list)
    shards_checked: int = 0
    samples_checked: int = 0

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


# -- datasets -----------------------------------------------------------------------------------
Detail = str | Callable[[int], str]  # a problem's wording, or row -> wording


class _DatasetChecker:
    """Checks the shards of one dataset, appending problem lines to a report."""

    def __init__(
        self,
        manifest: Manifest,
        fs: Any,
        base: str,
        store: ShardStore,
        report: ValidationReport,
        allow_pickle: bool = False,
    ) -> None:
        self.schema = manifest.schema
        self.fs, self.base, self.store, self.report = fs, base, store, report
        self.decoder = SampleDecoder(manifest.schema or None, allow_pickle=allow_pickle)
        self.exts = {spec.ext.lower() for spec in manifest.schema.values()}
        self.bound = {d: (int(n), MANIFEST_DIMS) for d, n in manifest.dims.items()}
        self.rel = ""  # the shard being checked
        self._listings: dict[str, dict[str, int | None] | None] = {}
        self._counts: dict[tuple[str | None, str], int] = {}

    def add(
        self, rule: str, detail: str, key: str | None = None, fld: str | None = None, rel: str = ""
    ) -> None:
        """A problem line: ``REL: sample KEY, field FIELD, rule RULE: DETAIL``."""
        where = [f"sample {key!r}"] if key is not None else []
        where += [f"field {fld!r}"] if fld is not None else []
        self.report.problems.append(
            f"{rel or self.rel}: {', '.join([*where, f'rule {rule}'])}: {detail}"
        )

    def note(
        self,
        rule: str,
        detail: Detail,
        key: str | None = None,
        fld: str | None = None,
        row: int = -1,
    ) -> None:
        """A per-sample problem; past MAX_LINES_PER_RULE per shard, field and rule, only counted
        (a callable ``detail`` is called only for the lines kept)."""
        n = self._counts[(fld, rule)] = self._counts.get((fld, rule), 0) + 1
        if n <= MAX_LINES_PER_RULE:
            self.add(rule, detail(row) if callable(detail) else detail, key, fld)

    def note_rows(
        self, rule: str, fld: str, keys: Sequence[str], rows: Iterable[int], detail: Detail
    ) -> None:
        for row in rows:
            self.note(rule, detail, keys[int(row)], fld, int(row))

    # -- files ----------------------------------------------------------------------------------
    def _size(self, rel: str) -> tuple[bool, int | None]:
        """``(exists, size or None when unknown)`` of a file, from one listing per folder (files
        a listing does not show are probed one by one)."""
        folder, name = posixpath.split(rel)
        if folder not in self._listings:
            self._listings[folder] = self.store.list_dir(folder)
        listing = self._listings[folder]
        if listing is not None and name in listing:
            return True, listing[name]
        try:
            return True, self.store.file_size(rel)
        except FileNotFoundError:
            return False, None

    # -- one shard ------------------------------------------------------------------------------
    def check_shard(self, shard: ShardInfo, deep: bool, bar: Any) -> None:
        self.rel = shard.path
        done = 0
        try:
            exists, size = self._size(shard.path)
            if not exists:
                self.add("missing", "shard file not found")
            elif size is not None and size != shard.num_bytes:
                self.add(
                    "size",
                    f"file has {size} bytes, the manifest says {shard.num_bytes} (truncated or "
                    "changed after the build)",
                )
            offsets = self._check_index(shard)
            if exists and (size is None or size == shard.num_bytes):
                if not shard.sha256:
                    log.warning("%s: no sha256 in the manifest, checksum not verified", self.rel)
                elif (digest := self.store.sha256(shard)) != shard.sha256:
                    self.add(
                        "sha256",
                        f"file hashes to {digest}, the manifest says {shard.sha256} (corrupt or "
                        "changed after the build)",
                    )
            if deep and exists and offsets is not None:
                done = self._check_samples(shard, offsets, size, bar)
        except (WdsLoaderError, OSError, ValueError) as exc:
            self.add("read", f"{type(exc).__name__}: {exc}")
        self.report.shards_checked += 1
        self.report.samples_checked += done if deep else shard.num_samples
        bar.update(shard.num_samples - done if deep else 1)
        for (fld, rule), n in sorted(self._counts.items(), key=str):
            if n > MAX_LINES_PER_RULE:
                self.add(
                    rule, f"{n - MAX_LINES_PER_RULE} more sample(s) with this problem", fld=fld
                )
        self._counts.clear()

    def _check_index(self, shard: ShardInfo) -> np.ndarray | None:
        """The shard's sample offsets when its index is sound, else None (problems added)."""
        rel, n, size = shard.idx_path, shard.num_samples, shard.num_bytes
        try:
            data = cat_whole(self.fs, join(self.base, rel))  # no HEAD for its size
        except FileNotFoundError:
            self.add("index", f"index file not found (shard {shard.path})", rel=rel)
            return None
        if len(data) != (n + 1) * 8:
            detail = (
                f"index has {len(data)} bytes, expected {(n + 1) * 8} ({n} samples + 1 end offset)"
            )
            self.add("index", detail, rel=rel)
            return None
        raw = np.frombuffer(data, dtype=INDEX_DTYPE)
        problems = []
        if raw[0] > size:
            problems.append(f"first offset {raw[0]} lies past the shard's {size} bytes")
        # (a compressed shard's offsets are compressed byte offsets: any value)
        if shard.compression is None and (unaligned := np.flatnonzero(raw % BLOCK)).size:
            i = int(unaligned[0])
            problems.append(
                f"offset #{i} ({raw[i]}) is not on a {BLOCK}-byte tar block boundary "
                f"({unaligned.size} such)"
            )
        if (steps := np.flatnonzero(raw[1:] <= raw[:-1])).size:
            i = int(steps[0])
            problems.append(
                f"offsets are not strictly increasing: #{i} is {raw[i]}, #{i + 1} is {raw[i + 1]}"
            )
        if raw[-1] > size:
            problems.append(f"end offset {raw[-1]} lies past the end of the shard's {size} bytes")
        for p in problems:
            self.add("index", p, rel=rel)
        return None if problems else raw.astype(np.int64)

    # -- samples (deep) -------------------------------------------------------------------------
    def _check_samples(
        self, shard: ShardInfo, offsets: np.ndarray, size: int | None, bar: Any
    ) -> int:
        """Read, parse, decode and check every sample of a shard; the number read."""
        n = shard.num_samples
        limit = shard.num_bytes if size is None else min(size, shard.num_bytes)
        readable = int(np.searchsorted(offsets[1:], limit, side="right"))
        if readable < n:
            self.add(
                "truncated",
                f"samples #{readable}..#{n - 1} end past the file's {limit} bytes; not read",
            )
        seen: set[str] = set()
        i = 0
        while i < readable:
            by_bytes = int(np.searchsorted(offsets, offsets[i] + CHUNK_BYTES, side="right")) - 1
            j = max(i + 1, min(readable, i + CHUNK_SAMPLES, by_bytes))
            try:
                (data,) = self.store.read_ranges([(shard, int(offsets[i]), int(offsets[j]))])
            except (WdsLoaderError, OSError) as exc:
                self.add("read", f"samples #{i}..#{j - 1} unreadable: {exc}")
            else:
                self._check_chunk(shard, data, offsets[i : j + 1], i, seen)
            bar.update(j - i)
            i = j
        return readable

    def _check_chunk(
        self, shard: ShardInfo, data: bytes, offsets: np.ndarray, first: int, seen: set[str]
    ) -> None:
        """Check the samples of one chunk read from a shard (``offsets`` relative to the file)."""
        rel, base, view = self.rel, int(offsets[0]), memoryview(data)
        keys: list[str] = []
        values: dict[str, list[tuple[int, Any]]] = {}
        for k in range(len(offsets) - 1):
            start, stop = int(offsets[k]) - base, int(offsets[k + 1]) - base
            sample, at = data, base
            try:
                if shard.compression is not None:  # the sample's tar bytes, inflated
                    sample = inflate_sample(view[start:stop], f"{rel}: sample #{first + k}")
                    at, start, stop = at + start, 0, len(sample)
                key, raw = parse_sample(sample, start, stop, base_offset=at, source=rel)
            except WdsLoaderError as exc:
                self.note("parse", f"sample #{first + k}: {str(exc).removeprefix(rel + ' ')}")
                continue
            if key in seen:
                self.note("duplicate key", "an earlier sample has this key", key)
            seen.add(key)
            keys.append(key)
            if self.schema and (extra := sorted(set(raw) - self.exts)):
                self.note("members", f"members not in the schema: {extra}", key)
            for ext, (off, length) in (shard.layout or {}).items():
                member = raw.get(ext)
                if member is not None and member != view[start + off : start + off + length]:
                    where = f"at offset {off} with {length} bytes"
                    self.note("layout", f"member {ext!r} is not {where} as the layout says", key)
            if not self.schema:
                try:
                    self.decoder(raw, key, rel)
                except WdsLoaderError as exc:
                    self.note("decode", str(exc).removeprefix(f"{rel}: "), key)
                continue
            for fld in self.schema:
                try:
                    value = self.decoder.decode_field(raw, key, rel, fld)
                except WdsLoaderError as exc:
                    detail = str(exc).removeprefix(f"{rel}: sample {key!r}, field {fld!r} ")
                    self.note("decode", detail, key, fld)
                    continue
                values.setdefault(fld, []).append((len(keys) - 1, value))
        for fld, items in values.items():
            self._check_values(fld, self.schema[fld], keys, items)

    def _check_values(
        self, fld: str, spec: FieldSpec, keys: Sequence[str], items: list[tuple[int, Any]]
    ) -> None:
        """dtype, shape (symbolic dims), finiteness and range of one field's decoded values;
        arrays are checked per group of equal dtype and shape."""
        kind, _ = delivery_kind(spec.encoding, spec.dtype)
        arrays: dict[tuple[str, tuple[int, ...]], list[tuple[int, np.ndarray]]] = {}
        numbers: list[tuple[int, Any]] = []
        others: list[tuple[int, Any]] = []
        for row, value in items:
            if isinstance(value, np.ndarray):
                arrays.setdefault((value.dtype.str, value.shape), []).append((row, value))
            elif isinstance(value, int | float | np.number) and not isinstance(value, bool):
                numbers.append((row, value))
            else:
                others.append((row, value))
        tail = expected_tail(spec) if spec.encoding == "npy" else None
        for (dtype_str, shape), group in arrays.items():
            rows = [r for r, _ in group]
            dtype = np.dtype(dtype_str)
            if kind == TENSOR and spec.encoding == "npy" and dtype != np.dtype(spec.dtype):
                self.note_rows("dtype", fld, keys, rows, f"dtype {dtype}, schema says {spec.dtype}")
                continue
            if tail is not None:
                label = f"field {fld!r} of sample {keys[rows[0]]!r} in {self.rel}"
                if (problem := shape_problem(tail, shape, self.bound, label)) is not None:
                    self.note_rows("shape", fld, keys, rows, problem)
                    continue
            if dtype.kind in "biufc":
                x = torch.from_numpy(np.stack([v for _, v in group]))
                self._check_numeric(fld, spec, keys, rows, x)
        if numbers:
            try:
                x = torch.from_numpy(np.asarray([v for _, v in numbers]))
            except TypeError:  # ints beyond int64 (the decoder casts declared int dtypes)
                pass
            else:
                self._check_numeric(fld, spec, keys, [r for r, _ in numbers], x)
        if others and spec.range is not None:
            low, high = spec.range
            found = list_out_of_range([v for _, v in others], low, high)
            by_row = {others[i][0]: vals for i, vals in found.items()}
            self.note_rows(
                "range",
                fld,
                keys,
                by_row,
                lambda r: range_text(low, high, min(by_row[r]), max(by_row[r])),
            )

    def _check_numeric(
        self, fld: str, spec: FieldSpec, keys: Sequence[str], rows: list[int], x: torch.Tensor
    ) -> None:
        """Finiteness and range of stacked values ``x`` (row i is sample ``rows[i]``)."""
        if (bad := nonfinite_mask(x)) is not None:
            hit = [rows[i] for i in rows_of(bad)]

            def nonfinite(row: int) -> str:
                i = rows.index(row)
                return f"NaN/Inf, first offending value {first_value(x[i], bad[i])}"

            self.note_rows("finite", fld, keys, hit, nonfinite)
        if spec.range is not None:
            low, high = spec.range
            if (out := out_of_range(x, low, high)) is not None:
                hit = [rows[i] for i in rows_of(out)]

                def outside(row: int) -> str:
                    i = rows.index(row)
                    return range_text(low, high, *min_max(x[i], out[i]))

                self.note_rows("range", fld, keys, hit, outside)


def validate_dataset(
    root: str | os.PathLike[str],
    split: str | None = None,
    *,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    allow_pickle: bool = False,
) -> ValidationReport:
    """Check every shard of ``split`` (default: all splits) of the dataset at ``root``.

    Per shard: the file exists with the manifest's size; its index exists, has one offset per
    sample plus the end, on tar block boundaries, strictly increasing and inside the file; the
    sha256 matches the manifest's. ``deep=True`` also reads every sample (in chunks of many
    samples), parses and decodes every field with the manifest's schema and checks dtypes,
    shapes (symbolic dims against the manifest's dims), finiteness, declared ranges and the
    recorded member layout; ``allow_pickle=True`` (trusted data only) decodes pickle members
    and object arrays as the loader's ``allow_pickle`` does. Every problem becomes one line of
    the report naming the shard (and the sample key, field and rule where they apply); data
    problems never raise. A missing or unreadable manifest, or an unknown ``split``, raises
    :class:`~wdsloader.errors.ManifestError`.
    ``progress=True`` shows a tqdm bar over shards (``deep``: over samples) when stderr is a
    terminal.
    """
    manifest = load_manifest(root, storage_options)
    stored_curriculum(manifest.loader_defaults, manifest_where(root, storage_options))
    names = list(manifest.splits) if split is None else [split]
    shards = [s for name in names for s in manifest.split(name).shards]
    fs, base = url_to_fs(root, storage_options)
    report = ValidationReport()
    store = ShardStore(root, ReadOptions(storage_options=storage_options))
    total = sum(s.num_samples for s in shards) if deep else len(shards)
    unit = "sample" if deep else "shard"
    try:
        checker = _DatasetChecker(manifest, fs, base, store, report, allow_pickle)
        with progress_bar(total=total, unit=unit, desc="validate", enabled=progress) as bar:
            for shard in shards:
                checker.check_shard(shard, deep, bar)
    finally:
        store.close()
    log.info(
        "%s: %d shards, %d samples checked, %d problems",
        store.redact(os.fspath(root)),
        report.shards_checked,
        report.samples_checked,
        len(report.problems),
    )
    return report
