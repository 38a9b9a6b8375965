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

import os
import sys
from collections.abc import Iterator
from typing import Any

from build_shards.errors import BuildError
from build_shards.sources.base import SequentialSource, Source, qualname
from build_shards.sources.files import JsonlSource, TextSource, base_suffix, resolve_files
from build_shards.sources.hf import HFDatasetDictSource, HFDatasetSource, HFIterableSource

JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")


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


class IteratorSource(SequentialSource):
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
        return {"kind": self.kind, "class": qualname(self._ds), "length": self.length}


class TorchIterableSource(SequentialSource):
    """A torch ``IterableDataset`` of dicts (iterated once, in the parent)."""

    kind = "torch-iterable"

    def __init__(self, ds: Any) -> None:
        super().__init__()
        self._ds = ds

    def _iterate(self) -> Iterator[Any]:
        return iter(self._ds)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": qualname(self._ds)}


def _file_source(spec: Any) -> Source:
    files = resolve_files(spec)
    if not files:
        raise BuildError("no input files given")
    kinds = set()
    for path in files:
        suffix = base_suffix(path)
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
    ray_data = sys.modules.get("ray.data")
    if ray_data is not None and isinstance(source, ray_data.Dataset):
        from build_shards.sources.raydata import RayDataSource

        return RayDataSource(source)
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
        f"unsupported source type {qualname(source)}: expected a datasets Dataset/DatasetDict/"
        "IterableDataset, a ray.data Dataset, a torch Dataset or IterableDataset, a list/tuple/"
        "iterator of dicts, or paths of .jsonl or text files"
    )
