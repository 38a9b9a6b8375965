"""Check batches and whole datasets against the manifest's schema.

:func:`validate_batch` checks one collated batch (field set, dtypes, shapes with symbolic dims,
finiteness, declared ranges) and raises :class:`BatchValidationError` naming the field, the rule,
the offending value and the sample keys; :func:`validate_first_batch` does so for the first batch
a loader made by :func:`wdsloader.create_loader` would yield. :func:`wdsloader.validate.validate_dataset`
checks whole datasets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from wdsloader.errors import BatchValidationError
from wdsloader.format import FieldSpec

__all__ = ["BatchValidationError", "validate_batch", "validate_first_batch"]

log = logging.getLogger(__name__)

MAX_KEYS_SHOWN = 5
MANIFEST_DIMS = "the manifest dims"

# How the default collator delivers a field: a tensor of a known dtype, a list, or either.
TENSOR, _LIST, _ANY = "tensor", "list", "any"
_LIST_ENCODINGS = frozenset(("txt", "text"))
_ANY_DTYPES = frozenset(("json", "image"))
_LIST_DTYPES = frozenset(("str", "bytes"))


# -- rules shared by batches and samples --------------------------------------------------------
@lru_cache(maxsize=256)
def delivery_kind(encoding: str, dtype: str | None) -> tuple[str, torch.dtype | None]:
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
        return TENSOR, torch.from_numpy(np.empty(0, np_dtype)).dtype
    except TypeError:  # a numpy dtype torch has no tensor type for
        return _ANY, None


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expected_tail(spec: FieldSpec) -> list[Any] | None:
    """The per-sample shape a field's values have (None: not fixed by the schema)."""
    if spec.shape is not None:
        return list(spec.shape)
    return [] if spec.encoding in ("cls", "cls2", "index", "id") else None


def shape_problem(
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


def rows_of(mask: torch.Tensor) -> np.ndarray:
    """Rows (leading index) of a boolean tensor holding any True."""
    return mask.reshape(mask.shape[0], -1).any(dim=1).nonzero().flatten().cpu().numpy()


def nonfinite_mask(x: torch.Tensor) -> torch.Tensor | None:
    """The NaN/Inf mask of a floating tensor with at least one, else None."""
    if not (x.is_floating_point() or x.is_complex()) or x.numel() == 0:
        return None
    bad = ~torch.isfinite(x)
    return bad if bool(bad.any()) else None


def out_of_range(x: torch.Tensor, low: float, high: float) -> torch.Tensor | None:
    """The mask of values outside ``[low, high]`` of a real tensor with at least one, else None."""
    if x.is_complex() or x.numel() == 0:
        return None
    if x.dtype == torch.bool:
        x = x.to(torch.int8)
    bad = (x < low) | (x > high)
    return bad if bool(bad.any()) else None


def first_value(x: torch.Tensor, bad: torch.Tensor) -> Any:
    return x[bad].flatten()[0].item()


def min_max(x: torch.Tensor, bad: torch.Tensor) -> tuple[Any, Any]:
    vals = x[bad]
    return vals.min().item(), vals.max().item()


def list_out_of_range(values: Sequence[Any], low: float, high: float) -> dict[int, list[float]]:
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


def range_text(low: float, high: float, lo: Any, hi: Any) -> str:
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
        _check_keys(b, batch, schema)
    for name in fields:
        _check_type(b, name, schema[name], batch[name])
    _check_shapes(b, batch, schema, fields, dims)
    for name in fields:
        _check_finite(b, name, batch[name])
    for name in fields:
        _check_range(b, name, schema[name], batch[name])
    return True


def _check_keys(b: _Batch, batch: Mapping[str, Any], schema: Mapping[str, FieldSpec]) -> None:
    """Rule 'keys': the batch's fields are exactly the schema's (``__`` metadata aside)."""
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


def _check_shapes(
    b: _Batch,
    batch: Mapping[str, Any],
    schema: Mapping[str, FieldSpec],
    fields: Sequence[str],
    dims: Mapping[str, int] | None,
) -> None:
    """Rules 'shape' and 'batch size': one leading batch size; tails match, dims bound once."""
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
        tail = expected_tail(spec)
        if isinstance(value, torch.Tensor) and tail is not None:
            problem = shape_problem(tail, value.shape[1:], bound, f"field {name!r}")
            if problem is not None:
                raise b.error(name, "shape", f"{problem} (batch shape {list(value.shape)})")
    if b.names is not None and b.size is not None and len(b.names) != b.size:
        raise b.error(
            "__key__", "batch size", f"{len(b.names)} keys, but field {first!r} has {b.size} rows"
        )


def _check_finite(b: _Batch, name: str, value: Any) -> None:
    """Rule 'finite': no NaN/Inf in a floating tensor field."""
    if isinstance(value, torch.Tensor) and (bad := nonfinite_mask(value)) is not None:
        rows = rows_of(bad)
        raise b.error(
            name,
            "finite",
            f"{len(rows)} sample(s) hold NaN/Inf, first offending value {first_value(value, bad)}",
            rows,
        )


def _check_range(b: _Batch, name: str, spec: FieldSpec, value: Any) -> None:
    """Rule 'range': values inside the field's declared range."""
    if spec.range is None:
        return
    low, high = spec.range
    if isinstance(value, torch.Tensor):
        bad = out_of_range(value, low, high)
        if bad is not None:
            rows = rows_of(bad)
            text = range_text(low, high, *min_max(value, bad))
            raise b.error(name, "range", f"{len(rows)} sample(s) {text}", rows)
    elif isinstance(value, list | tuple) and (found := list_out_of_range(value, low, high)):
        vals = [v for row_vals in found.values() for v in row_vals]
        text = range_text(low, high, min(vals), max(vals))
        raise b.error(name, "range", f"{len(found)} sample(s) {text}", sorted(found))


def _check_type(b: _Batch, name: str, spec: FieldSpec, value: Any) -> None:
    """The dtype rule of one field (a tensor of the schema's dtype, or a list)."""
    if spec.optional and isinstance(value, list | tuple):
        return  # an optional field: a list where a sample of the batch lacks it (None)
    kind, dtype = delivery_kind(spec.encoding, spec.dtype)
    if kind == TENSOR:
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
    from wdsloader.stream.dataset import ShardStreamDataset
    from wdsloader.stream.loader import WdsDataLoader

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
