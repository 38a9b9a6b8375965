"""Collators: turn a list of decoded samples into a batch. A registry keyed by name and modality.

A collator is made by a *factory* ``(**options) -> collate`` where ``collate(samples) -> batch``.
:func:`get_collator` picks one by name, or by modality (the one registered first for it), and
never falls back silently: an unknown name or modality is a ValueError listing what exists.

Collate functions run inside DataLoader workers, which receive them by pickle under the
``spawn``/``forkserver`` start methods: a factory should return an instance of a module-level
class (as the built-ins do) or a module-level function, never a closure or lambda.

Built in: ``default`` (modality ``any``) stacks arrays and numbers into tensors and keeps
everything else as lists; ``causal_lm`` (modality ``text``) shifts token ids into
``input_ids``/``labels`` for next-token prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "IGNORE_INDEX",
    "CausalLMCollator",
    "CollateFn",
    "CollatorInfo",
    "DefaultCollator",
    "get_collator",
    "list_collators",
    "register_collator",
]

CollateFn = Callable[[list[dict[str, Any]]], Any]
Factory = Callable[..., CollateFn]
IGNORE_INDEX = -100  # the label PyTorch's cross-entropy ignores by default
ANY = "any"


@dataclass(slots=True, frozen=True)
class CollatorInfo:
    """What :func:`list_collators` reports about one registered collator."""

    name: str
    modality: str
    description: str


_FACTORIES: dict[str, Factory] = {}
_INFO: dict[str, CollatorInfo] = {}


def register_collator(
    name: str, modality: str = ANY, description: str = "", *, replace: bool = False
) -> Callable[[Factory], Factory]:
    """Decorator registering a collator factory under ``name`` for ``modality``.

    The factory takes keyword options and returns ``collate(samples) -> batch``, a picklable
    callable (see the module docstring). A name already
    registered is a ValueError unless ``replace=True``. The first collator registered for a
    modality is the one :func:`get_collator` returns for that modality.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"collator name must be a non-empty string, got {name!r}")
    if not isinstance(modality, str) or not modality:
        raise ValueError(f"modality must be a non-empty string, got {modality!r}")

    def decorate(factory: Factory) -> Factory:
        if not callable(factory):
            raise TypeError(f"collator factory for {name!r} must be callable, got {factory!r}")
        if name in _FACTORIES and not replace:
            raise ValueError(
                f"a collator named {name!r} is already registered; pass replace=True to override it"
            )
        _FACTORIES[name] = factory
        _INFO[name] = CollatorInfo(name=name, modality=modality, description=description)
        return factory

    return decorate


def list_collators() -> list[CollatorInfo]:
    """Every registered collator, in registration order."""
    return list(_INFO.values())


def get_collator(
    name: str | None = None, *, modality: str | None = None, **kwargs: Any
) -> CollateFn:
    """A collate function: the collator ``name``, else the one for ``modality``, else ``default``.

    ``kwargs`` go to the factory. An unknown name is a ValueError listing the registered names;
    a modality nothing is registered for is a ValueError listing the modalities there are. Giving
    both checks that the named collator serves that modality (or ``any``).
    """
    if name is not None:
        info = _INFO.get(name)
        if info is None:
            raise ValueError(f"unknown collator {name!r}; registered: {sorted(_INFO)}")
        if modality is not None and info.modality not in (modality, ANY):
            raise ValueError(
                f"collator {name!r} is for modality {info.modality!r}, not {modality!r}"
            )
    elif modality is not None:
        name = next((i.name for i in _INFO.values() if i.modality == modality), None)
        if name is None:
            modalities = sorted({i.modality for i in _INFO.values()})
            raise ValueError(
                f"no collator registered for modality {modality!r}; modalities: {modalities}"
            )
    else:
        name = "default"
    return _FACTORIES[name](**kwargs)


# ------------------------------------------------------------------------------------------------
# default
# ------------------------------------------------------------------------------------------------


def _check_batch(samples: Sequence[dict[str, Any]]) -> list[str]:
    """The field names of a batch; ValueError on an empty batch or differing field sets."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    first = samples[0]
    keys = first.keys()
    for i, s in enumerate(samples):
        if s.keys() != keys:
            missing, extra = sorted(keys - s.keys()), sorted(s.keys() - keys)
            raise ValueError(
                f"samples {_key(first, 0)} and {_key(s, i)} have different fields "
                f"(the second lacks {missing} and adds {extra})"
            )
    return list(keys)


def _key(sample: dict[str, Any], position: int) -> str:
    key = sample.get("__key__")
    return repr(key) if key is not None else f"#{position}"


def _stack_arrays(name: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> Any:
    """Arrays of one shape and dtype stacked into a tensor (numeric) or kept as a list."""
    first = values[0]
    shape, dtype = first.shape, first.dtype
    for i, v in enumerate(values):
        if not isinstance(v, np.ndarray) or v.shape != shape or v.dtype != dtype:
            raise ValueError(
                f"field {name!r}: sample {_key(samples[0], 0)} has shape {list(shape)} "
                f"{dtype} but sample {_key(samples[i], i)} has {_describe(v)}; cannot stack"
            )
    if dtype.kind not in "biufc":
        return values  # strings, objects, structured records: nothing torch can hold
    out = np.empty((len(values), *shape), dtype=dtype)
    for i, v in enumerate(values):
        out[i] = v
    return torch.from_numpy(out)


def _stack_tensors(name: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> Any:
    shape = values[0].shape
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.shape != shape or v.dtype != values[0].dtype:
            raise ValueError(
                f"field {name!r}: sample {_key(samples[0], 0)} holds a tensor of shape "
                f"{list(shape)} {values[0].dtype} but sample {_key(samples[i], i)} holds "
                f"{_describe(v)}; cannot stack"
            )
    return torch.stack(values)


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor | np.ndarray):
        return f"shape {list(v.shape)} {v.dtype}"
    return f"a {type(v).__name__}"


def _collate_field(name: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> Any:
    """One field of the default collator (see :func:`default_collator`)."""
    first = values[0]
    if name == "__key__":
        return values
    kind = type(first)
    if isinstance(first, np.ndarray):
        return _stack_arrays(name, values, samples)
    if isinstance(first, torch.Tensor):
        return _stack_tensors(name, values, samples)
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
    if len(types) == 1 and issubclass(kind, np.generic):
        dtypes = {v.dtype for v in values}
        if len(dtypes) == 1 and first.dtype.kind in "biufc":
            return torch.from_numpy(np.array(values, dtype=first.dtype))
    return values


class DefaultCollator:
    """The ``default`` collator as a picklable callable (see :func:`default_collator`)."""

    __slots__ = ()

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        names = _check_batch(samples)
        return {n: _collate_field(n, [s[n] for s in samples], samples) for n in names}

    def collate_columns(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The same batch from columns (see :func:`_collate_columns`)."""
        return _collate_columns(columns)

    def __eq__(self, other: object) -> bool:
        return type(other) is DefaultCollator

    def __hash__(self) -> int:
        return hash(DefaultCollator)

    def __repr__(self) -> str:
        return "DefaultCollator()"


@register_collator(
    "default",
    ANY,
    "numpy arrays, tensors and numbers stacked into tensors; everything else as lists",
)
def default_collator() -> CollateFn:
    """The default collator: a dict of fields -> batched values.

    - numpy arrays of one shape and dtype -> ``torch.from_numpy`` of the stacked array (a
      mismatch is a ValueError naming the field and the keys of two samples that differ);
      arrays of strings or objects stay a list;
    - torch tensors of one shape and dtype -> ``torch.stack``;
    - Python ``bool`` -> bool tensor; ``int`` -> int64; ``float`` (or ints mixed with floats)
      -> **float32** (the dtype models train in; keep float64 data as numpy arrays);
    - numpy scalars of one numeric dtype -> a tensor of that dtype;
    - ``__key__``, str, bytes, dict, list, None and anything mixed -> a Python list.

    Every sample must have the same fields; an empty batch is a ValueError.
    """
    return DefaultCollator()


def _collate_columns(columns: dict[str, Any]) -> dict[str, Any]:
    """The default collator over a batch already held as columns (``field -> (n, ...) array``
    for fields gathered for the whole batch, ``field -> list`` for the others)."""
    keys = columns.get("__key__")
    samples = [{"__key__": k} for k in keys] if keys is not None else []
    out: dict[str, Any] = {}
    for name, values in columns.items():
        if isinstance(values, np.ndarray) and values.dtype.kind in "biufc":
            out[name] = torch.from_numpy(values)
        else:
            out[name] = _collate_field(name, list(values), samples)
    return out


# ------------------------------------------------------------------------------------------------
# causal_lm
# ------------------------------------------------------------------------------------------------


def _token_rows(samples: Sequence[dict[str, Any]], field: str) -> list[np.ndarray]:
    rows = []
    for i, s in enumerate(samples):
        if field not in s:
            raise ValueError(
                f"causal_lm: sample {_key(s, i)} has no field {field!r}; its fields: {sorted(s)}"
            )
        value = s[field]
        row = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if row.ndim != 1 or row.dtype.kind not in "iu" or row.size < 2:
            raise ValueError(
                f"causal_lm: field {field!r} of sample {_key(s, i)} must be a 1-D integer array "
                f"of at least 2 token ids, got shape {list(row.shape)} dtype {row.dtype}"
            )
        rows.append(row)
    return rows


@dataclass(slots=True, frozen=True)
class CausalLMCollator:
    """The ``causal_lm`` collator as a picklable callable (see :func:`causal_lm_collator`)."""

    field: str = "tokens"
    pad_id: int | None = None

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        field, pad_id = self.field, self.pad_id
        if not samples:
            raise ValueError("cannot collate an empty batch")
        rows = _token_rows(samples, field)
        length = max(r.size for r in rows)
        if pad_id is None:
            for i, r in enumerate(rows):
                if r.size != rows[0].size:
                    raise ValueError(
                        f"causal_lm: field {field!r} has {rows[0].size} tokens in sample "
                        f"{_key(samples[0], 0)} but {r.size} in sample {_key(samples[i], i)}; "
                        "pass pad_id to pad rows of different lengths"
                    )
        tokens = np.full((len(rows), length), pad_id if pad_id is not None else 0, np.int64)
        for i, r in enumerate(rows):
            tokens[i, : r.size] = r
        inputs = torch.from_numpy(tokens[:, :-1].copy())
        labels = torch.from_numpy(tokens[:, 1:].copy())
        if pad_id is None:
            mask = torch.ones_like(inputs)
        else:
            mask = (inputs != pad_id).to(torch.int64)
            labels[labels == pad_id] = IGNORE_INDEX
        batch: dict[str, Any] = {"input_ids": inputs, "labels": labels, "attention_mask": mask}
        if "__key__" in samples[0]:
            batch["__key__"] = [s.get("__key__") for s in samples]
        return batch


@register_collator(
    "causal_lm",
    "text",
    "next-token prediction: input_ids = tokens[:-1], labels = tokens[1:], optional padding",
)
def causal_lm_collator(field: str = "tokens", pad_id: int | None = None) -> CollateFn:
    """Shift token ids for next-token prediction.

    Each sample's ``field`` holds L + 1 token ids. The batch is ``input_ids = tokens[:, :-1]``,
    ``labels = tokens[:, 1:]`` (both int64), ``attention_mask`` (int64 ones) and ``__key__``
    when the samples have keys. With ``pad_id``, rows of different lengths are right-padded with
    it to the longest, input positions holding ``pad_id`` get attention 0 and label positions
    holding it get ``-100`` (ignored by the loss). Without ``pad_id`` all rows must have the
    same length.
    """
    return CausalLMCollator(field=field, pad_id=pad_id)
