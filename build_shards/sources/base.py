"""The :class:`Source` interface every input adapter implements, and the base of the
sequential ones (read once, from the start); see :mod:`build_shards.sources`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from build_shards.errors import BuildError


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

    def count_hint(self) -> int | None:
        """About how many items the source holds, when that is cheap to learn (for the
        progress bar's total and the choice of processes, never for the shard layout)."""
        return self.length


class SequentialSource(Source):
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


def qualname(obj: Any) -> str:
    """``module.QualName`` of ``obj``'s type, as the resume fingerprint and errors name it."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
