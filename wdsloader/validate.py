"""Check batches and whole datasets against the manifest's schema.

:func:`validate_batch` checks one collated batch (field set, dtypes, shapes with symbolic dims,
finiteness, declared ranges) and raises :class:`BatchValidationError` naming the field, the rule,
the offending value and the sample keys; :func:`validate_first_batch` does so for the first batch
a loader made by :func:`wdsloader.create_loader` would yield. :func:`validate_dataset` checks every
shard of a dataset (files, sizes, indexes, checksums and, with ``deep=True``, every sample) and
reports every problem it finds instead of stopping at the first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from wdsloader.decode import SampleDecoder, parse_sample
from wdsloader.errors import WdsLoaderError
from wdsloader.fetch import ReadOptions, ShardStore
from wdsloader.format import FieldSpec, Manifest, ShardInfo
from wdsloader.format.index import INDEX_DTYPE
from wdsloader.format.tar import BLOCK
from wdsloader.storage import join, url_to_fs

__all__ = [
    "BatchValidationError",
    "ValidationReport",
    "validate_batch",
    "validate_dataset",
    "validate_first_batch",
]

log = logging.getLogger(__name__)

MAX_KEYS_SHOWN = 5
MAX_LINES_PER_RULE = 10  # per shard, field and rule; the rest are counted in one line
CHUNK_SAMPLES = 4096
CHUNK_BYTES = 32 * 2**20
HASH_CHUNK = 8 * 2**20
MANIFEST_DIMS = "the manifest dims"

# How the default collator delivers a field: a tensor of a known dtype, a list, or either.
_TENSOR, _LIST, _ANY = "tensor", "list", "any"
_LIST_ENCODINGS = frozenset(("txt", "text"))
_ANY_DTYPES = frozenset(("json", "image"))
_LIST_DTYPES = frozenset(("str", "bytes"))


class BatchValidationError(AssertionError):
    """A batch does not match the dataset's schema.

    The message names the field, the rule, the offending value and the sample key(s); ``field``
    (None when the problem is not one field's), ``rule`` and ``keys`` (the offending samples'
    keys, ``#row`` where the batch has no ``__key__``) hold them too.
    """

    def __init__(
        self, message: str, *, field: str | None = None, rule: str = "", keys: Iterable[str] = ()
    ) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule
        self.keys = list(keys)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args, self.__dict__)


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


# -- rules shared by batches and samples --------------------------------------------------------
@lru_cache(maxsize=256)
def _kind(encoding: str, dtype: str | None) -> tuple[str, torch.dtype | None]:
    """How the default collator delivers a field of this encoding and dtype, with its torch
    dtype when it is a tensor of a known dtype."""
    if encoding in _LIST_ENCODINGS or dtype in _LIST_DTYPES:
        return _LIST, None
    if encoding in ("json", "jsn") or dtype is None or dtype in _ANY_DTYPES:
        return _ANY, None
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        return _ANY, None
    if np_dtype.kind in "US":
        return _LIST, None
    if np_dtype.kind not in "biufc":
        return _ANY, None
    try:
        return _TENSOR, torch.from_numpy(np.empty(0, np_dtype)).dtype
    except TypeError:  # a numpy dtype torch has no tensor type for
        return _ANY, None


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _expected_tail(spec: FieldSpec) -> list[Any] | None:
    """The per-sample shape a field's values have (None: not fixed by the schema)."""
    if spec.shape is not None:
        return list(spec.shape)
    return [] if spec.encoding in ("cls", "cls2", "index", "id") else None


def _shape_problem(
    spec_shape: Sequence[Any],
    actual: Sequence[int],
    bound: dict[str, tuple[int, str]],
    label: str,
) -> str | None:
    """Why the per-sample shape ``actual`` does not fit ``spec_shape``, or None.

    Symbolic dims are looked up in ``bound`` (name -> (size, who bound it)); new ones are bound
    to ``label`` only when the whole shape fits (the first binding wins).
    """
    actual = [int(a) for a in actual]
    if len(actual) != len(spec_shape):
        return f"per-sample shape {actual}, schema says {_fmt_shape(spec_shape)}"
    new: dict[str, tuple[int, str]] = {}
    for dim, size in zip(spec_shape, actual, strict=True):
        if isinstance(dim, str):
            prev = bound.get(dim) or new.get(dim)
            if prev is None:
                new[dim] = (size, label)
            elif prev[0] != size:
                return (
                    f"{dim}={size} (per-sample shape {actual}), but {prev[1]} has {dim}={prev[0]}"
                )
        elif dim != size:
            return f"per-sample shape {actual}, schema says {_fmt_shape(spec_shape)}"
    bound.update(new)
    return None


def _rows_of(mask: torch.Tensor) -> np.ndarray:
    """Rows (leading index) of a boolean tensor holding any True."""
    return mask.reshape(mask.shape[0], -1).any(dim=1).nonzero().flatten().cpu().numpy()


def _nonfinite(x: torch.Tensor) -> torch.Tensor | None:
    """The NaN/Inf mask of a floating tensor with at least one, else None."""
    if not (x.is_floating_point() or x.is_complex()) or x.numel() == 0:
        return None
    bad = ~torch.isfinite(x)
    return bad if bool(bad.any()) else None


def _out_of_range(x: torch.Tensor, low: float, high: float) -> torch.Tensor | None:
    """The mask of values outside ``[low, high]`` of a real tensor with at least one, else None."""
    if x.is_complex() or x.numel() == 0:
        return None
    if x.dtype == torch.bool:
        x = x.to(torch.int8)
    bad = (x < low) | (x > high)
    return bad if bool(bad.any()) else None


def _first_value(x: torch.Tensor, bad: torch.Tensor) -> Any:
    return x[bad].flatten()[0].item()


def _min_max(x: torch.Tensor, bad: torch.Tensor) -> tuple[Any, Any]:
    vals = x[bad]
    return vals.min().item(), vals.max().item()


def _list_out_of_range(values: Sequence[Any], low: float, high: float) -> dict[int, list[float]]:
    """Rows of a list of JSON-like values holding numbers outside ``[low, high]``, with them."""
    out: dict[int, list[float]] = {}
    for row, value in enumerate(values):
        if isinstance(value, bool) or value is None:
            continue
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            continue  # not numbers: a range does not apply
        bad = arr[(arr < low) | (arr > high)]
        if bad.size:
            out[row] = bad.tolist()
    return out


def _range_text(low: float, high: float, lo: Any, hi: Any) -> str:
    return f"outside [{low}, {high}]: min offending value {lo}, max offending value {hi}"


def _keys_text(keys: Sequence[str]) -> str:
    if not keys:
        return "(none named)"
    shown = ", ".join(repr(k) for k in keys[:MAX_KEYS_SHOWN])
    if len(keys) > MAX_KEYS_SHOWN:
        shown += f" and {len(keys) - MAX_KEYS_SHOWN} more ({len(keys)} samples)"
    return shown


# -- batches ------------------------------------------------------------------------------------
class _Batch:
    """A batch being validated: names its rows and words its errors."""

    def __init__(self, batch: Mapping[str, Any]) -> None:
        self.batch = batch
        names = batch.get("__key__")
        self.names = list(names) if isinstance(names, list | tuple) else None
        self.size: int | None = None

    def keys(self, rows: Iterable[int] | None = None) -> list[str]:
        if rows is None:
            if self.names is not None:
                return [str(k) for k in self.names]
            rows = range(self.size or 0)
        n = self.names
        return [str(n[r]) if n is not None and 0 <= r < len(n) else f"#{r}" for r in rows]

    def error(
        self, field: str | None, rule: str, detail: str, rows: Iterable[int] | None = None
    ) -> BatchValidationError:
        keys = self.keys(None if rows is None else [int(r) for r in rows])
        where = f"field {field!r}" if field is not None else "batch"
        return BatchValidationError(
            f"{where} failed rule {rule!r}: {detail}; sample(s): {_keys_text(keys)}",
            field=field,
            rule=rule,
            keys=keys,
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dtype} with shape {list(value.shape)}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _leading(value: Any) -> int | None:
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.ndim else None
    return len(value) if isinstance(value, list | tuple) else None


def validate_batch(
    batch: Mapping[str, Any],
    schema: Mapping[str, FieldSpec],
    *,
    dims: Mapping[str, int] | None = None,
    exact_keys: bool = True,
) -> bool:
    """Check a collated batch against ``schema``; True, or :class:`BatchValidationError`.

    ``batch`` is what the default collator makes: field -> tensor with a leading batch dim, or a
    list (strings, JSON, bytes); ``__key__`` names the samples in messages; other ``__`` keys
    are metadata. Rules, in order: the field set is exactly the schema's (``exact_keys``; with
    it off, only the schema's fields present are checked); dtypes (tensors of the schema's
    dtype, lists for text and bytes, a list or tensor for JSON); shapes ``[B, *spec.shape]`` with
    one batch size and symbolic dims bound consistently across fields and against ``dims``; no
    NaN/Inf in floating fields; values inside declared ranges.
    """
    if not isinstance(batch, Mapping):
        raise BatchValidationError(
            f"batch failed rule 'type': expected a dict of fields, got {_describe(batch)}",
            rule="type",
        )
    b = _Batch(batch)
    fields = [name for name in schema if name in batch]
    if exact_keys:
        missing = [name for name in schema if name not in batch]
        present = {k for k in batch if not (isinstance(k, str) and k.startswith("__"))}
        unexpected = sorted((k for k in present if k not in schema), key=str)
        if missing or unexpected:
            odd = missing + unexpected
            raise b.error(
                odd[0] if len(odd) == 1 else None,
                "keys",
                f"missing fields {missing}, unexpected fields {unexpected}",
            )
    for name in fields:
        _check_type(b, name, schema[name], batch[name])
    bound = {str(d): (int(n), MANIFEST_DIMS) for d, n in (dims or {}).items()}
    first: str | None = None
    for name in fields:
        value, spec = batch[name], schema[name]
        lead = _leading(value)
        if lead is None:
            raise b.error(name, "shape", f"{_describe(value)} has no batch dimension")
        if first is None:
            first, b.size = name, lead
        elif lead != b.size:
            raise b.error(name, "batch size", f"{lead} rows, but field {first!r} has {b.size} rows")
        tail = _expected_tail(spec)
        if isinstance(value, torch.Tensor) and tail is not None:
            problem = _shape_problem(tail, value.shape[1:], bound, f"field {name!r}")
            if problem is not None:
                raise b.error(name, "shape", f"{problem} (batch shape {list(value.shape)})")
    if b.names is not None and b.size is not None and len(b.names) != b.size:
        raise b.error(
            "__key__", "batch size", f"{len(b.names)} keys, but field {first!r} has {b.size} rows"
        )
    for name in fields:
        value = batch[name]
        if isinstance(value, torch.Tensor) and (bad := _nonfinite(value)) is not None:
            rows = _rows_of(bad)
            raise b.error(
                name,
                "finite",
                f"{len(rows)} sample(s) hold NaN/Inf, first offending value "
                f"{_first_value(value, bad)}",
                rows,
            )
    for name in fields:
        value, spec = batch[name], schema[name]
        if spec.range is None:
            continue
        low, high = spec.range
        if isinstance(value, torch.Tensor):
            bad = _out_of_range(value, low, high)
            if bad is not None:
                rows = _rows_of(bad)
                text = _range_text(low, high, *_min_max(value, bad))
                raise b.error(name, "range", f"{len(rows)} sample(s) {text}", rows)
        elif isinstance(value, list | tuple) and (found := _list_out_of_range(value, low, high)):
            vals = [v for row_vals in found.values() for v in row_vals]
            text = _range_text(low, high, min(vals), max(vals))
            raise b.error(name, "range", f"{len(found)} sample(s) {text}", sorted(found))
    return True


def _check_type(b: _Batch, name: str, spec: FieldSpec, value: Any) -> None:
    """The dtype rule of one field (a tensor of the schema's dtype, or a list)."""
    kind, dtype = _kind(spec.encoding, spec.dtype)
    if kind == _TENSOR:
        if not isinstance(value, torch.Tensor):
            raise b.error(
                name, "dtype", f"expected a tensor of {spec.dtype}, got {_describe(value)}"
            )
        if value.dtype != dtype:
            raise b.error(name, "dtype", f"dtype {value.dtype}, schema says {spec.dtype} ({dtype})")
    elif kind == _LIST:
        if not isinstance(value, list | tuple):
            raise b.error(
                name,
                "dtype",
                f"expected a list (one {spec.dtype or spec.encoding} per sample), "
                f"got {_describe(value)}",
            )
    elif not isinstance(value, torch.Tensor | list | tuple):
        raise b.error(name, "dtype", f"expected a tensor or a list, got {_describe(value)}")


def validate_first_batch(loader: Any) -> bool:
    """Validate the first batch ``loader`` would yield against its output schema; True, or
    :class:`BatchValidationError`. The loader yields the same batches afterwards.

    ``loader`` must come from :func:`wdsloader.create_loader` (TypeError otherwise).
    """
    from wdsloader.dataset import ShardStreamDataset
    from wdsloader.loader import WdsDataLoader

    ds = getattr(loader, "dataset_obj", None)
    if not isinstance(loader, WdsDataLoader) or not isinstance(ds, ShardStreamDataset):
        raise TypeError(
            "validate_first_batch needs a loader made by wdsloader.create_loader, got "
            f"{type(loader).__name__}; call validate_batch(batch, schema) on a batch instead"
        )
    batch = ds.peek_batch()
    if batch is None:
        raise ValueError(f"split {ds.split!r}: this loader yields no batch to validate")
    return validate_batch(batch, ds.output_schema(), dims=ds.manifest.dims)


# -- datasets -----------------------------------------------------------------------------------
Detail = str | Callable[[int], str]  # a problem's wording, or row -> wording


class _DatasetChecker:
    """Checks the shards of one dataset, appending problem lines to a report."""

    def __init__(
        self, manifest: Manifest, fs: Any, base: str, store: ShardStore, report: ValidationReport
    ) -> None:
        self.schema = manifest.schema
        self.fs, self.base, self.store, self.report = fs, base, store, report
        self.decoder = SampleDecoder(manifest.schema or None)
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
            path = join(self.base, folder) if folder else self.base
            try:
                self.fs.invalidate_cache(path)
                entries = self.fs.ls(path, detail=True)
            except Exception as exc:  # a listing only saves requests
                log.debug("%s: no listing (%r); probing files one by one", path, exc)
                entries = None
            self._listings[folder] = (
                None
                if entries is None
                else {
                    posixpath.basename(str(e["name"]).rstrip("/")): e.get("size")
                    for e in entries
                    if e.get("type", "file") == "file"
                }
            )
        listing = self._listings[folder]
        if listing is not None and name in listing:
            size = listing[name]
        else:
            try:
                size = self.fs.info(join(self.base, rel)).get("size")
            except FileNotFoundError:
                return False, None
        return True, None if size is None else int(size)

    def _sha256(self, rel: str) -> str:
        sha = hashlib.sha256()
        with self.fs.open(join(self.base, rel), "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                sha.update(chunk)
        return sha.hexdigest()

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
                elif (digest := self._sha256(shard.path)) != shard.sha256:
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
            data = self.fs.cat_file(join(self.base, rel))
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
        if (unaligned := np.flatnonzero(raw % BLOCK)).size:
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
            try:
                key, raw = parse_sample(data, start, stop, base_offset=base, source=rel)
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
        kind, _ = _kind(spec.encoding, spec.dtype)
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
        tail = _expected_tail(spec) if spec.encoding == "npy" else None
        for (dtype_str, shape), group in arrays.items():
            rows = [r for r, _ in group]
            dtype = np.dtype(dtype_str)
            if kind == _TENSOR and spec.encoding == "npy" and dtype != np.dtype(spec.dtype):
                self.note_rows("dtype", fld, keys, rows, f"dtype {dtype}, schema says {spec.dtype}")
                continue
            if tail is not None:
                label = f"field {fld!r} of sample {keys[rows[0]]!r} in {self.rel}"
                if (problem := _shape_problem(tail, shape, self.bound, label)) is not None:
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
            found = _list_out_of_range([v for _, v in others], low, high)
            by_row = {others[i][0]: vals for i, vals in found.items()}
            self.note_rows(
                "range",
                fld,
                keys,
                by_row,
                lambda r: _range_text(low, high, min(by_row[r]), max(by_row[r])),
            )

    def _check_numeric(
        self, fld: str, spec: FieldSpec, keys: Sequence[str], rows: list[int], x: torch.Tensor
    ) -> None:
        """Finiteness and range of stacked values ``x`` (row i is sample ``rows[i]``)."""
        if (bad := _nonfinite(x)) is not None:
            hit = [rows[i] for i in _rows_of(bad)]

            def nonfinite(row: int) -> str:
                i = rows.index(row)
                return f"NaN/Inf, first offending value {_first_value(x[i], bad[i])}"

            self.note_rows("finite", fld, keys, hit, nonfinite)
        if spec.range is not None:
            low, high = spec.range
            if (out := _out_of_range(x, low, high)) is not None:
                hit = [rows[i] for i in _rows_of(out)]

                def outside(row: int) -> str:
                    i = rows.index(row)
                    return _range_text(low, high, *_min_max(x[i], out[i]))

                self.note_rows("range", fld, keys, hit, outside)


def validate_dataset(
    root: str | os.PathLike[str],
    split: str | None = None,
    *,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> ValidationReport:
    """Check every shard of ``split`` (default: all splits) of the dataset at ``root``.

    Per shard: the file exists with the manifest's size; its index exists, has one offset per
    sample plus the end, on tar block boundaries, strictly increasing and inside the file; the
    sha256 matches the manifest's. ``deep=True`` also reads every sample (in chunks of many
    samples), parses and decodes every field with the manifest's schema and checks dtypes,
    shapes (symbolic dims against the manifest's dims), finiteness, declared ranges and the
    recorded member layout. Every problem becomes one line of the report naming the shard (and
    the sample key, field and rule where they apply); data problems never raise. A missing or
    unreadable manifest, or an unknown ``split``, raises :class:`~wdsloader.errors.ManifestError`.
    ``progress=True`` shows a tqdm bar over shards (``deep``: over samples).
    """
    from tqdm import tqdm

    manifest = Manifest.load(root, storage_options)
    names = list(manifest.splits) if split is None else [split]
    shards = [s for name in names for s in manifest.split(name).shards]
    fs, base = url_to_fs(root, storage_options)
    report = ValidationReport()
    store = ShardStore(root, ReadOptions(storage_options=storage_options))
    total = sum(s.num_samples for s in shards) if deep else len(shards)
    unit = "sample" if deep else "shard"
    try:
        checker = _DatasetChecker(manifest, fs, base, store, report)
        with tqdm(total=total, unit=unit, desc="validate", disable=not progress) as bar:
            for shard in shards:
                checker.check_shard(shard, deep, bar)
    finally:
        store.close()
    log.info(
        "%s: %d shards, %d samples checked, %d problems",
        os.fspath(root),
        report.shards_checked,
        report.samples_checked,
        len(report.problems),
    )
    return report
