"""The ``default`` collator: a dict of fields -> batched values (tensors where they stack, lists
elsewhere)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wdsloader.collate.batch import check_batch, describe, sample_key

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec

_NUMERIC = "biufc"


def _unstackable(name: str, values: list[Any], samples: Sequence[dict[str, Any]], i: int) -> str:
    return (
        f"field {name!r}: sample {sample_key(samples[0], 0)} has {describe(values[0])} but "
        f"sample {sample_key(samples[i], i)} has {describe(values[i])}; cannot stack"
    )


def _stack_arrays(
    name: str, values: list[Any], samples: Sequence[dict[str, Any]], must: bool
) -> Any:
    """Numeric arrays of one shape and dtype -> a tensor; anything else -> the list (or a
    ValueError naming the field and the two samples that differ when ``must``)."""
    first = values[0]
    shape, dtype = first.shape, first.dtype
    for i, v in enumerate(values):
        if not isinstance(v, np.ndarray) or v.shape != shape or v.dtype != dtype:
            if must:
                raise ValueError(_unstackable(name, values, samples, i))
            return values
    if dtype.kind not in _NUMERIC:  # strings, objects, records: nothing torch can hold
        if must:
            raise ValueError(f"field {name!r} holds {dtype} arrays; cannot stack into a tensor")
        return values
    out = np.empty((len(values), *shape), dtype=dtype)
    for i, v in enumerate(values):
        out[i] = v
    return torch.from_numpy(out)


def _stack_tensors(
    name: str, values: list[Any], samples: Sequence[dict[str, Any]], must: bool
) -> Any:
    first = values[0]
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.shape != first.shape or v.dtype != first.dtype:
            if must:
                raise ValueError(_unstackable(name, values, samples, i))
            return values
    return torch.stack(values)


def _numbers(name: str, values: list[Any]) -> Any:
    """Python or numpy scalars -> a tensor, or None when they are not numbers of one kind."""
    types = set(map(type, values))
    if types == {bool}:
        return torch.tensor(values, dtype=torch.bool)
    if types == {int}:
        try:
            return torch.tensor(values, dtype=torch.int64)
        except RuntimeError as exc:  # an int beyond int64
            raise ValueError(f"field {name!r}: {exc}") from None
    if types <= {int, float} and float in types:
        return torch.tensor(values, dtype=torch.float32)
    if len(types) == 1 and issubclass(next(iter(types)), np.generic):
        dtypes = {v.dtype for v in values}
        if len(dtypes) == 1 and values[0].dtype.kind in _NUMERIC:
            return torch.from_numpy(np.array(values, dtype=values[0].dtype))
    return None


def collate_field(
    name: str, values: list[Any], samples: Sequence[dict[str, Any]], must: bool = False
) -> Any:
    """One field of the default collator (see :class:`DefaultCollator`); ``must``: the field was
    asked to be stacked (lists and scalars too), so what cannot stack is a ValueError."""
    first = values[0]
    if name == "__key__":
        return values
    if must and isinstance(first, list | tuple):
        values = [np.asarray(v) for v in values]
        first = values[0]
    if isinstance(first, np.ndarray):
        return _stack_arrays(name, values, samples, must)
    if isinstance(first, torch.Tensor):
        return _stack_tensors(name, values, samples, must)
    numbers = _numbers(name, values)
    if numbers is not None:
        return numbers
    if must:
        kinds = sorted({type(v).__name__ for v in values})
        raise ValueError(f"field {name!r} holds {kinds}; cannot stack into a tensor")
    return values


class DefaultCollator:
    """The ``default`` collator: a list of sample dicts -> a dict of fields -> batched values.

    - numpy arrays of one shape and dtype -> ``torch.from_numpy`` of the stacked array; torch
      tensors of one shape and dtype -> ``torch.stack``;
    - Python ``bool`` -> bool tensor; ``int`` -> int64; ``float`` (or ints mixed with floats)
      -> **float32** (the dtype models train in; keep float64 data as numpy arrays); numpy
      scalars of one numeric dtype -> a tensor of that dtype;
    - ``__key__``, str, bytes, dict, list, None, string arrays, ragged arrays (shapes or dtypes
      that differ) and anything mixed -> a Python list.

    Fields named in ``stack`` must become tensors (lists of numbers of one length too): one
    that cannot is a ValueError naming the field and the two samples that differ. Every sample
    must have the same fields; an empty batch is a ValueError. ``task_spec`` is accepted (as by
    every registered factory) and not used.
    """

    __slots__ = ("stack",)

    def __init__(self, task_spec: TaskSpec | None = None, *, stack: Iterable[str] = ()) -> None:
        if isinstance(stack, str):
            raise TypeError(f"stack takes field names, got the string {stack!r}")
        self.stack: tuple[str, ...] = tuple(stack)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        names = check_batch(samples, "default")
        missing = [f for f in self.stack if f not in names]
        if missing:
            raise ValueError(
                f"default: stack names {missing}, which sample {sample_key(samples[0], 0)} "
                f"lacks; its fields: {sorted(names)}"
            )
        return {
            n: collate_field(n, [s[n] for s in samples], samples, n in self.stack) for n in names
        }

    def collate_columns(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The same batch from columns (``field -> (n, ...) array`` for fields gathered for the
        whole batch, ``field -> list`` for the others)."""
        keys = columns.get("__key__")
        n = len(next(iter(columns.values()))) if columns else 0
        samples = [{"__key__": k} for k in keys] if keys is not None else [{}] * n
        out: dict[str, Any] = {}
        for name, values in columns.items():
            if isinstance(values, np.ndarray) and values.dtype.kind in _NUMERIC:
                out[name] = torch.from_numpy(values)
            else:
                out[name] = collate_field(name, list(values), samples, name in self.stack)
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is DefaultCollator and other.stack == self.stack

    def __hash__(self) -> int:
        return hash((DefaultCollator, self.stack))

    def __repr__(self) -> str:
        return f"DefaultCollator(stack={self.stack!r})" if self.stack else "DefaultCollator()"

    def __getstate__(self) -> tuple[str, ...]:
        return self.stack

    def __setstate__(self, state: tuple[str, ...]) -> None:
        self.stack = state
