"""Sources: the adapters that turn every kind of input ``build_shards`` accepts into
``(index, raw)`` pairs (lists, iterators, torch and HF datasets, JSONL and text files)."""

from build_shards.sources.base import SequentialSource, Source
from build_shards.sources.files import JsonlSource, TextSource, resolve_files
from build_shards.sources.open import open_source

__all__ = [
    "JsonlSource",
    "SequentialSource",
    "Source",
    "TextSource",
    "open_source",
    "resolve_files",
]
