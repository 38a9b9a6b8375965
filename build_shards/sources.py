"""Source adapters: one small interface over every kind of input ``build_shards`` accepts.

A :class:`Source` knows its length when it can, and iterates ``(index, raw)`` pairs over a
contiguous range of source indices. ``raw`` becomes a sample dict through :attr:`Source.decoder`
(``None`` when it already is one); decoding runs where the sample is processed, so a worker
process parses JSON lines the parent only read.

* Indexable sources (``indexable = True``: lists, tuples, HF ``Dataset``/``DatasetDict``, torch
  map-style datasets) are read by each worker for its own range.
* Sequential ones (generators, iterators, HF and torch ``IterableDataset``, JSONL and text files)
  are iterated once, by the parent; indices are positions in that stream.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from build_shards.errors import BuildError
from wdsloader.io.storage import url_to_fs

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
_HF_CHUNK = 1024  # rows read from an HF Dataset at a time


class Source:
    """Base adapter. Subclasses set ``kind``, ``length`` and ``indexable`` and implement
    :meth:`iter_range`."""

    kind: str = "source"
    length: int | None = None
    indexable: bool = False
    # items live in this process's memory: workers get each block's items rather than a copy
    # of the whole source
    in_memory: bool = False
    #: Splits fixed by the source itself (a DatasetDict), in order; None when it has none.
    fixed_splits: tuple[str, ...] | None = None
    #: Picklable ``raw -> dict`` run where a sample is processed; None when raw is the dict.
    decoder: Callable[[Any], Any] | None = None

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        """``(index, raw)`` for source indices in ``[start, stop)`` (``stop=None``: to the end)."""
        raise NotImplementedError

    def split_of(self, index: int) -> str | None:
        """The split a source index belongs to when the source fixes it, else None."""
        return None

    def describe(self) -> dict[str, Any]:
        """What identifies this input for the resume fingerprint (kind, length, files ...)."""
        return {"kind": self.kind, "length": self.length}


class _SequentialSource(Source):
    """A source that can be iterated once, from its start."""

    def __init__(self) -> None:
        self._used = False

    def _iterate(self) -> Iterator[Any]:
        raise NotImplementedError

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        if start != 0 or stop is not None:
            raise ValueError(f"a {self.kind} source is sequential: iterate it from 0 to its end")
        if self._used:
            raise BuildError(f"the {self.kind} source was already consumed (it can be read once)")
        self._used = True
        return enumerate(self._iterate())


class ListSource(Source):
    """A list or tuple of sample dicts."""

    kind = "list"
    length: int
    indexable = True
    in_memory = True

    def __init__(self, items: list[Any] | tuple[Any, ...]) -> None:
        self._items = items
        self.length = len(items)

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        stop = self.length if stop is None else stop
        for i in range(start, stop):
            yield i, self._items[i]


class IteratorSource(_SequentialSource):
    """A generator or any iterator of sample dicts (read once, by the parent)."""

    kind = "iterator"

    def __init__(self, it: Iterator[Any]) -> None:
        super().__init__()
        self._it = it

    def _iterate(self) -> Iterator[Any]:
        return self._it


class TorchMapSource(Source):
    """A torch map-style ``Dataset`` (``len`` and ``__getitem__``) returning dicts."""

    kind = "torch"
    length: int
    indexable = True

    def __init__(self, ds: Any) -> None:
        try:
            self.length = len(ds)
        except TypeError:
            raise TypeError(
                f"torch map-style dataset {type(ds).__qualname__} has no __len__; "
                "give it one or make it an IterableDataset"
            ) from None
        self._ds = ds

    def iter_range(self, start: int, stop: int | None) -> Iterator[tuple[int, Any]]:
        stop = self.length if stop is None else stop
        for i in range(start, stop):
            yield i, self._ds[i]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": _qualname(self._ds), "length": self.length}


class TorchIterableSource(_SequentialSource):
    """A torch ``IterableDataset`` of dicts (iterated once, in the parent)."""

    kind = "torch-iterable"

    def __init__(self, ds: Any) -> None:
        super().__init__()
        self._ds = ds

    def _iterate(self) -> Iterator[Any]:
        return iter(self._ds)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": _qualname(self._ds)}


# ------------------------------------------------------------------------------------------------
# Hugging Face datasets
# ------------------------------------------------------------------------------------------------


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


class HFIterableSource(_SequentialSource):
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


# ------------------------------------------------------------------------------------------------
# Files: JSONL and plain text
# ------------------------------------------------------------------------------------------------


def decode_jsonl_line(raw: tuple[str, int, bytes]) -> dict[str, Any]:
    """A JSONL line ``(file, line number, bytes)`` as a dict, or a BuildError naming file:line."""
    name, lineno, line = raw
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{name}:{lineno}: not a valid JSON line: {exc}") from None
    if not isinstance(obj, dict):
        raise BuildError(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def decode_text_document(raw: str) -> dict[str, Any]:
    """A plain-text document as the sample ``{"text": doc}``."""
    return {"text": raw}


def _base_suffix(path: str) -> str:
    low = path.lower()
    for comp in _COMPRESSION_SUFFIXES:
        if low.endswith(comp):
            low = low[: -len(comp)]
            break
    return os.path.splitext(low)[1]


def resolve_files(spec: str | os.PathLike[str] | Iterable[Any]) -> list[str]:
    """Paths or URLs of the files named by a path, a glob or a list of them (globs sorted)."""
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[str] = []
    for item in specs:
        text = os.fspath(item)
        fs, path = url_to_fs(text)
        if any(c in text for c in "*?["):
            matches = sorted(fs.glob(path))
            if not matches:
                raise BuildError(f"no input file matches {text!r}")
            files.extend(
                fs.unstrip_protocol(m) if "://" in text else m for m in matches if not fs.isdir(m)
            )
        elif not fs.exists(path):
            raise BuildError(f"input not found: {text}")
        elif fs.isdir(path):
            raise BuildError(
                f"input {text} is a folder: name the files (a glob such as dir/*.jsonl)"
            )
        else:
            files.append(text)
    return files


def _file_stamp(path: str) -> dict[str, Any]:
    fs, p = url_to_fs(path)
    info = fs.info(p)
    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag")
    return {"path": path, "size": info.get("size"), "stamp": str(stamp)}


class _FileSource(_SequentialSource):
    def __init__(self, files: list[str]) -> None:
        super().__init__()
        self.files = files

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": [_file_stamp(f) for f in self.files]}


class JsonlSource(_FileSource):
    """JSONL files, one sample per non-blank line; a bad line is a BuildError naming file:line."""

    kind = "jsonl"
    decoder = staticmethod(decode_jsonl_line)

    def _iterate(self) -> Iterator[Any]:
        import fsspec

        for path in self.files:
            with fsspec.open(path, "rb", compression="infer") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        yield (path, lineno, line)


class TextSource(_FileSource):
    """Plain text files; documents are separated by blank lines, each becomes ``{"text": doc}``."""

    kind = "text"
    decoder = staticmethod(decode_text_document)

    def _iterate(self) -> Iterator[Any]:
        import fsspec

        for path in self.files:
            lines: list[str] = []
            with fsspec.open(path, "rb", compression="infer") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8").rstrip("\r\n")
                    except UnicodeDecodeError as exc:
                        raise BuildError(f"{path}:{lineno}: not UTF-8 text: {exc}") from None
                    if line.strip():
                        lines.append(line)
                    elif lines:
                        yield "\n".join(lines)
                        lines = []
            if lines:
                yield "\n".join(lines)


def _file_source(spec: Any) -> Source:
    files = resolve_files(spec)
    if not files:
        raise BuildError("no input files given")
    kinds = set()
    for path in files:
        suffix = _base_suffix(path)
        if suffix in JSONL_SUFFIXES:
            kinds.add("jsonl")
        elif suffix in TEXT_SUFFIXES:
            kinds.add("text")
        else:
            raise BuildError(
                f"cannot tell the format of {path}: use {', '.join(JSONL_SUFFIXES)} for JSON lines "
                f"or {', '.join(TEXT_SUFFIXES)} for plain text"
            )
    if len(kinds) > 1:
        raise BuildError("input files mix JSONL and plain text: build them separately")
    return JsonlSource(files) if kinds == {"jsonl"} else TextSource(files)


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def open_source(source: Any) -> Source:
    """The adapter for ``source``; a TypeError names an unsupported type."""
    if isinstance(source, Source):
        return source
    hf = sys.modules.get("datasets")
    if hf is not None:
        if isinstance(source, hf.DatasetDict):
            return HFDatasetDictSource(source)
        if isinstance(source, hf.Dataset):
            return HFDatasetSource(source)
        if isinstance(source, hf.IterableDataset):
            return HFIterableSource(source)
    tud = sys.modules.get("torch.utils.data")
    if tud is not None:
        if isinstance(source, tud.IterableDataset):
            return TorchIterableSource(source)
        if isinstance(source, tud.Dataset):
            return TorchMapSource(source)
    if _is_path(source):
        return _file_source(source)
    if isinstance(source, (list, tuple)):
        if source and all(_is_path(x) for x in source):
            return _file_source(source)
        return ListSource(source)
    if isinstance(source, Iterator):
        return IteratorSource(source)
    raise TypeError(
        f"unsupported source type {_qualname(source)}: expected a datasets Dataset/DatasetDict/"
        "IterableDataset, a torch Dataset or IterableDataset, a list/tuple/iterator of dicts, or "
        "paths of .jsonl or text files"
    )
