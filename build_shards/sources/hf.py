"""Hugging Face ``datasets`` inputs (``Dataset``, ``DatasetDict``, ``IterableDataset``): numeric
list columns become numpy arrays of their feature dtype."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from build_shards.sources.base import SequentialSource, Source

_HF_CHUNK = 1024  # rows read from an HF Dataset at a time


def _numeric_array_feature(feature: Any) -> tuple[int, str] | None:
    """``(depth, dtype)`` of a (nested) list feature of numeric values, else None.

    Such columns become numpy arrays of the feature's own dtype (HF's numpy formatter would turn
    float64 into float32).
    """
    depth = 0
    while type(feature).__name__ in ("List", "LargeList", "Sequence"):
        feature = getattr(feature, "feature", None)
        if isinstance(feature, dict):
            return None
        depth += 1
    if type(feature).__name__.startswith("Array") and hasattr(feature, "shape"):
        depth += len(feature.shape)
        dtype = getattr(feature, "dtype", None)
    elif depth and type(feature).__name__ == "Value":
        dtype = feature.dtype
    else:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    return (depth, dt.str) if dt.kind in "biuf" else None


def _array_columns(features: Mapping[str, Any] | None) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for name, feature in (features or {}).items():
        found = _numeric_array_feature(feature)
        if found is not None:
            out[name] = found
    return out


def _as_array(value: Any, dtype: str) -> Any:
    return None if value is None else np.asarray(value, dtype=np.dtype(dtype))


def _list_column_rows(column: Any, depth: int, dtype: str) -> list[Any]:
    """Rows of an Arrow list column as numpy arrays, without a round trip through Python lists
    when every row has the same shape."""
    import pyarrow.compute as pc

    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    n = len(arr)
    dims: list[int] = []
    level = arr
    uniform = type(arr.type).__name__ in ("ListType", "LargeListType", "FixedSizeListType")
    for _ in range(depth):
        if not uniform or level.null_count or not hasattr(level, "flatten"):
            uniform = False
            break
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False)
        if len(lengths) and np.any(lengths != lengths[0]):
            uniform = False
            break
        dims.append(int(lengths[0]) if len(lengths) else 0)
        level = level.flatten()
    if uniform and n:
        values = level.to_numpy(zero_copy_only=False).astype(np.dtype(dtype), copy=False)
        return list(values.reshape(n, *dims))
    return [_as_array(v, dtype) for v in arr.to_pylist()]


class HFDatasetSource(Source):
    """A ``datasets.Dataset``: numeric list columns become numpy arrays of their feature dtype,
    other columns come as HF's Python format gives them (PIL images for ``Image`` ...)."""

    kind = "hf-dataset"
    length: int
    indexable = True

    def __init__(self, ds: Any) -> None:
        self._ds = ds.with_format(None)
        self.length = len(ds)
        self._arrays = _array_columns(ds.features)
        self._views: tuple[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_ds": self._ds, "length": self.length, "_arrays": self._arrays, "_views": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def _get_views(self) -> tuple[Any, Any]:
        if self._views is None:
            names = list(self._ds.column_names)
            arrays = [c for c in names if c in self._arrays]
            others = [c for c in names if c not in self._arrays]
            arr_view = self._ds.select_columns(arrays).with_format("arrow") if arrays else None
            py_view = self._ds.select_columns(others) if others else None
            self._views = (arr_view, py_view)
        return self._views

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        stop = self.length if stop is None else stop
        arr_view, py_view = self._get_views()
        names = list(self._ds.column_names)
        for a in range(start, stop, _HF_CHUNK):
            b = min(stop, a + _HF_CHUNK)
            cols: dict[str, list[Any]] = {}
            if arr_view is not None:
                table = arr_view[a:b]
                for name in table.column_names:
                    depth, dtype = self._arrays[name]
                    cols[name] = _list_column_rows(table.column(name), depth, dtype)
            if py_view is not None:
                cols.update(py_view[a:b])
            for j in range(b - a):
                yield a + j, {name: cols[name][j] for name in names}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "length": self.length,
            "fingerprint": getattr(self._ds, "_fingerprint", None),
        }


class HFDatasetDictSource(Source):
    """A ``datasets.DatasetDict``: its splits, one after the other, keep their names."""

    kind = "hf-datasetdict"
    length: int
    indexable = True

    def __init__(self, dd: Mapping[str, Any]) -> None:
        self._parts = [(name, HFDatasetSource(ds)) for name, ds in dd.items()]
        self.fixed_splits = tuple(name for name, _ in self._parts)
        self.split_starts: list[int] = []
        total = 0
        for _, part in self._parts:
            self.split_starts.append(total)
            total += part.length
        self.length = total

    def split_of(self, index: int) -> str | None:
        return self._parts[bisect.bisect_right(self.split_starts, index) - 1][0]

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        stop = self.length if stop is None else stop
        for (_, part), offset in zip(self._parts, self.split_starts, strict=True):
            lo, hi = max(start, offset), min(stop, offset + part.length)
            if lo < hi:
                for i, raw in part.iter_range(lo - offset, hi - offset):
                    yield offset + i, raw

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "parts": {n: p.describe() for n, p in self._parts}}


class HFIterableSource(SequentialSource):
    """A ``datasets.IterableDataset`` (read once, by the parent); numeric list columns become
    numpy arrays of their feature dtype when the features are known."""

    kind = "hf-iterable"

    def __init__(self, ds: Any) -> None:
        super().__init__()
        self._ds = ds
        self._arrays = _array_columns(getattr(ds, "features", None))

    def _iterate(self) -> Iterator[Any]:
        for row in self._ds:
            if self._arrays and isinstance(row, dict):
                row = dict(row)
                for name, (_, dtype) in self._arrays.items():
                    if name in row:
                        row[name] = _as_array(row[name], dtype)
            yield row
