"""What every collator shares: the collate function type, the ignored label, batch checks and
the names errors use for samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

CollateFn = Callable[[list[dict[str, Any]]], Any]
IGNORE_INDEX = -100  # the label PyTorch's cross-entropy ignores by default


def check_batch(samples: Sequence[dict[str, Any]], who: str = "collate") -> list[str]:
    """The field names of a batch; ValueError on an empty batch or differing field sets."""
    if not samples:
        raise ValueError(f"{who}: cannot collate an empty batch")
    first = samples[0]
    keys = first.keys()
    for i, s in enumerate(samples):
        if s.keys() != keys:
            missing, extra = sorted(keys - s.keys()), sorted(s.keys() - keys)
            raise ValueError(
                f"{who}: samples {sample_key(first, 0)} and {sample_key(s, i)} have different "
                f"fields (the second lacks {missing} and adds {extra})"
            )
    return list(keys)


def sample_key(sample: dict[str, Any], position: int) -> str:
    """How errors name a sample: its ``__key__``, else its position in the batch."""
    key = sample.get("__key__")
    return repr(key) if key is not None else f"#{position}"


def describe(value: Any) -> str:
    """A value's shape and dtype (arrays, tensors) or its type, for error messages."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return f"shape {list(value.shape)} {value.dtype}"
    return f"a {type(value).__name__}"


def keys_of(samples: Sequence[dict[str, Any]]) -> list[Any] | None:
    """The samples' ``__key__`` values, or None when they carry none."""
    if "__key__" not in samples[0]:
        return None
    return [s.get("__key__") for s in samples]


def as_int_row(value: Any, field: str, sample: dict[str, Any], position: int, who: str) -> Any:
    """A 1-D integer numpy array from a list, array or tensor of token ids."""
    row = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
        raise ValueError(
            f"{who}: field {field!r} of sample {sample_key(sample, position)} must be a 1-D "
            f"sequence of integer token ids, got {describe(row)}"
        )
    return row.astype(np.int64, copy=False)


def collate_columns(collate_fn: Callable[..., Any], columns: dict[str, Any]) -> Any:
    """Collate a batch held as columns: by the collator's column method when it has one,
    otherwise one dict per sample (rows of the gathered arrays are views)."""
    by_columns = getattr(collate_fn, "collate_columns", None)
    if by_columns is not None:
        return by_columns(columns)
    names = list(columns)
    cols = [columns[k] for k in names]
    return collate_fn([dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)])
