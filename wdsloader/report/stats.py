"""Per-field statistics of a sample of a split's rows: what the report page shows of each field."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from wdsloader.decode import IMAGE_ENCODINGS
from wdsloader.format import FieldSpec

LABEL_MAX_DISTINCT = 50  # an integer field with at most this many values gets a label histogram
TEXT_LABEL_MAX_DISTINCT = 20  # a text field too, when each value repeats on average


@dataclasses.dataclass
class NumberSummary:
    """min/max/mean over the non-NaN values and the share of NaN values (None: no finite
    value was seen)."""

    count: int
    min: float | None
    max: float | None
    mean: float | None
    nan_share: float


@dataclasses.dataclass
class FieldStats:
    """What the sampled rows hold in one field.

    ``kind``: ``number``, ``array``, ``image``, ``text``, ``bytes``, ``json`` or ``missing``
    (every sampled row lacked it). ``numbers``: scalar values (kind ``number``) or every element
    of the arrays (``array``). ``labels``: value -> rows, for fields with few distinct values.
    ``lengths``: characters of text, bytes of raw values. ``shapes``/``dtypes``: of arrays and
    images, ``"16x16x3"`` -> rows.
    """

    name: str
    kind: str
    rows: int
    missing: int
    numbers: NumberSummary | None = None
    labels: Counter[str] | None = None
    lengths: list[int] = dataclasses.field(default_factory=list)
    shapes: Counter[str] = dataclasses.field(default_factory=Counter)
    dtypes: Counter[str] = dataclasses.field(default_factory=Counter)


def is_image(spec: FieldSpec | None) -> bool:
    """True for a field the schema declares as an image."""
    return spec is not None and (spec.dtype == "image" or spec.encoding in IMAGE_ENCODINGS)


def as_array(value: Any) -> np.ndarray | None:
    """A numpy array of ``value`` when it is an array or a tensor, else None."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "shape") and hasattr(value, "numpy") and hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    return None


def shape_text(shape: Sequence[int]) -> str:
    """``(16, 16, 3)`` -> ``16x16x3``; a 0-d shape -> ``scalar``."""
    return "x".join(str(int(d)) for d in shape) or "scalar"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating, np.bool_)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf"
    )


def summarize_numbers(values: Sequence[Any]) -> NumberSummary:
    """min/max/mean/NaN share of scalar numbers."""
    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    nan = np.isnan(arr)
    kept = arr[~nan]
    share = float(nan.mean()) if len(arr) else 0.0
    if not len(kept):
        return NumberSummary(len(arr), None, None, None, share)
    return NumberSummary(len(arr), float(kept.min()), float(kept.max()), float(kept.mean()), share)


def summarize_arrays(arrays: Sequence[np.ndarray]) -> NumberSummary | None:
    """min/max/mean/NaN share over every element of numeric arrays (None: none is numeric).
    Reduced array by array: a sample of large arrays is never concatenated."""
    count = nans = 0
    total, low, high = 0.0, math.inf, -math.inf
    for arr in arrays:
        if arr.dtype.kind not in "biuf" or arr.size == 0:
            continue
        flat = arr.astype(np.float64, copy=False).reshape(-1)
        nan = np.isnan(flat)
        kept = flat[~nan] if nan.any() else flat
        count, nans = count + flat.size, nans + int(nan.sum())
        if kept.size:
            total += float(kept.sum())
            low, high = min(low, float(kept.min())), max(high, float(kept.max()))
    if count == 0:
        return None
    if count == nans:
        return NumberSummary(count, None, None, None, 1.0)
    return NumberSummary(count, low, high, total / (count - nans), nans / count)


def _kind(spec: FieldSpec | None, present: Sequence[Any]) -> str:
    if not present:
        return "missing"
    first = present[0]
    if is_image(spec) and as_array(first) is not None:
        return "image"
    if all(_is_number(v) for v in present):
        return "number"
    if as_array(first) is not None:
        return "array"
    if isinstance(first, str):
        return "text"
    if isinstance(first, (bytes, bytearray, memoryview)):
        return "bytes"
    return "json"


def _labels(spec: FieldSpec | None, kind: str, present: Sequence[Any]) -> Counter[str] | None:
    """value -> rows for a field with few distinct values (a class label, a category)."""
    if kind == "number":
        integral = all(float(v).is_integer() for v in present if not np.isnan(float(v)))
        if not integral and not (spec is not None and spec.encoding == "cls"):
            return None
        counts = Counter(str(int(v)) for v in present if not np.isnan(float(v)))
        return counts if len(counts) <= LABEL_MAX_DISTINCT else None
    if kind == "text":
        counts = Counter(str(v) for v in present)
        small = len(counts) <= TEXT_LABEL_MAX_DISTINCT and len(present) >= 2 * len(counts)
        return counts if small else None
    return None


def field_stats(name: str, spec: FieldSpec | None, values: Sequence[Any]) -> FieldStats:
    """The statistics of field ``name`` over its values in the sampled rows (None: the row
    lacks the field)."""
    present = [v for v in values if v is not None]
    kind = _kind(spec, present)
    stats = FieldStats(name, kind, len(values), len(values) - len(present))
    if kind == "number":
        stats.numbers = summarize_numbers(present)
    elif kind in ("array", "image"):
        arrays = [a for a in (as_array(v) for v in present) if a is not None]
        stats.shapes = Counter(shape_text(a.shape) for a in arrays)
        stats.dtypes = Counter(str(a.dtype) for a in arrays)
        if kind == "array":
            stats.numbers = summarize_arrays(arrays)
    elif kind == "text":
        stats.lengths = [len(v) for v in present]
    elif kind == "bytes":
        stats.lengths = [len(bytes(v)) for v in present]
    stats.labels = _labels(spec, kind, present)
    return stats


def sample_indices(num_rows: int, samples: int | None, seed: int = 0) -> list[int]:
    """The rows a report reads: all of them when ``samples`` is None or at least ``num_rows``,
    else ``samples`` rows drawn without replacement by a seeded generator, in index order (a
    random draw, not a stride: a stride aliases with periodic data such as ``label = i % 10``)."""
    if samples is None or samples >= num_rows:
        return list(range(num_rows))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(num_rows, size=samples, replace=False))
