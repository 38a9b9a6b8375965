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


def _floats(
    name: str, values: list[Any], samples: Sequence[dict[str, Any]], float64: bool
) -> torch.Tensor:
    """Python floats (and ints) -> float32, or float64 when ``float64``; a finite value that
    float32 (or float64) cannot hold is a ValueError naming the field, sample and value."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an int beyond float64
        top = int(np.finfo(np.float64).max)  # compared as ints: an int beyond it has no float
        i = next(i for i, v in enumerate(values) if isinstance(v, int) and abs(v) > top)
        raise ValueError(
            f"field {name!r} of sample {sample_key(samples[i], i)} holds an int beyond "
            "float64's range"
        ) from None
    if float64:
        return torch.from_numpy(array)
    with np.errstate(over="ignore"):
        narrow = array.astype(np.float32)
    over = np.flatnonzero(np.isinf(narrow) & np.isfinite(array))
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"field {name!r} of sample {sample_key(samples[i], i)} holds {values[i]!r}, which "
            f"float32 cannot hold (it would become inf); keep the field float64 with "
            f"collate_options={{'float64': [{name!r}]}} (DefaultCollator(float64=[{name!r}]))"
        )
    return torch.from_numpy(narrow)


def _numbers(name: str, values: list[Any], samples: Sequence[dict[str, Any]], float64: bool) -> Any:
    """Python or numpy scalars -> a tensor, or None when they are not numbers of one kind."""
    types = set(map(type, values))
    if types == {bool}:
        return torch.tensor(values, dtype=torch.bool)
    if types <= {int, float} and (float in types or float64):
        return _floats(name, values, samples, float64)
    if types == {int}:
        try:
            return torch.tensor(values, dtype=torch.int64)
        except RuntimeError as exc:  # an int beyond int64
            raise ValueError(f"field {name!r}: {exc}") from None
    if len(types) == 1 and issubclass(next(iter(types)), np.generic):
        dtypes = {v.dtype for v in values}
        if len(dtypes) == 1 and values[0].dtype.kind in _NUMERIC:
            return torch.from_numpy(np.array(values, dtype=values[0].dtype))
    return None


def collate_field(
    name: str,
    values: list[Any],
    samples: Sequence[dict[str, Any]],
    must: bool = False,
    float64: bool = False,
) -> Any:
    """One field of the default collator (see :class:`DefaultCollator`); ``must``: the field was
    asked to be stacked (lists and scalars too), so what cannot stack is a ValueError;
    ``float64``: its Python numbers become float64."""
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
    numbers = _numbers(name, values, samples, float64)
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
      -> **float32** (the dtype models train in; keep float64 data as numpy arrays), or
      float64 for the fields named in ``float64`` (their ints too, so every batch has one
      dtype); a finite float that float32 cannot hold (e.g. ``1e300``) is a ValueError naming
      the field, the sample and the value, never a silent inf; numpy scalars of one numeric
      dtype -> a tensor of that dtype;
    - ``__key__``, str, bytes, dict, list, None, string arrays, ragged arrays (shapes or dtypes
      that differ) and anything mixed -> a Python list.

    Fields named in ``optional`` (the schema's optional fields: the loader passes them) are
    always a Python list, ``None`` where a sample lacks the value, so that their type does not
    change from one batch to the next.

    Fields named in ``stack`` must become tensors (lists of numbers of one length too): one
    that cannot is a ValueError naming the field and the two samples that differ. Every sample
    must have the same fields; an empty batch is a ValueError. ``task_spec`` is accepted (as by
    every registered factory) and not used.
    """

    __slots__ = ("float64", "optional", "stack")

    def __init__(
        self,
        task_spec: TaskSpec | None = None,
        *,
        stack: Iterable[str] = (),
        float64: Iterable[str] = (),
        optional: Iterable[str] = (),
    ) -> None:
        for option, value in (("stack", stack), ("float64", float64), ("optional", optional)):
            if isinstance(value, str):
                raise TypeError(f"{option} takes field names, got the string {value!r}")
        self.stack: tuple[str, ...] = tuple(stack)
        self.float64: tuple[str, ...] = tuple(float64)
        self.optional: tuple[str, ...] = tuple(optional)
        both = sorted(set(self.stack) & set(self.optional))
        if both:
            raise ValueError(f"optional fields {both} cannot be stacked: a sample may lack them")

    def _field(self, name: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> Any:
        if name in self.optional:
            return list(values)
        return collate_field(name, values, samples, name in self.stack, name in self.float64)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        names = check_batch(samples, "default")
        missing = [f for f in self.stack if f not in names]
        if missing:
            raise ValueError(
                f"default: stack names {missing}, which sample {sample_key(samples[0], 0)} "
                f"lacks; its fields: {sorted(names)}"
            )
        return {n: self._field(n, [s[n] for s in samples], samples) for n in names}

    def collate_columns(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The same batch from columns (``field -> (n, ...) array`` for fields gathered for the
        whole batch, ``field -> list`` for the others)."""
        keys = columns.get("__key__")
        n = len(next(iter(columns.values()))) if columns else 0
        samples = [{"__key__": k} for k in keys] if keys is not None else [{}] * n
        out: dict[str, Any] = {}
        for name, values in columns.items():
            if name in self.optional:
                out[name] = list(values)
            elif isinstance(values, np.ndarray) and values.dtype.kind in _NUMERIC:
                out[name] = torch.from_numpy(values)
            else:
                out[name] = self._field(name, list(values), samples)
        return out

    def __eq__(self, other: object) -> bool:
        return type(other) is DefaultCollator and other.__getstate__() == self.__getstate__()

    def __hash__(self) -> int:
        return hash((DefaultCollator, *self.__getstate__()))

    def __repr__(self) -> str:
        named = (("stack", self.stack), ("float64", self.float64), ("optional", self.optional))
        options = [f"{k}={v!r}" for k, v in named if v]
        return f"DefaultCollator({', '.join(options)})"

    def __getstate__(self) -> tuple[tuple[str, ...], ...]:
        return self.stack, self.float64, self.optional

    def __setstate__(self, state: tuple[tuple[str, ...], ...]) -> None:
        self.stack, self.float64, self.optional = state
