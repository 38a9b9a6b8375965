"""The ``causal_lm`` collator: pre-packed token chunks -> next-token ``input_ids``/``labels``."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wdsloader.collate.batch import IGNORE_INDEX, keys_of, sample_key

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec


def _token_rows(samples: list[dict[str, Any]], field: str) -> list[np.ndarray]:
    rows = []
    for i, s in enumerate(samples):
        if field not in s:
            raise ValueError(
                f"causal_lm: sample {sample_key(s, i)} has no field {field!r}; "
                f"its fields: {sorted(s)}"
            )
        value = s[field]
        row = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if row.ndim != 1 or row.dtype.kind not in "iu" or row.size < 2:
            raise ValueError(
                f"causal_lm: field {field!r} of sample {sample_key(s, i)} must be a 1-D integer "
                f"array of at least 2 token ids, got shape {list(row.shape)} dtype {row.dtype}"
            )
        rows.append(row)
    return rows


@dataclass(slots=True, frozen=True)
class CausalLMCollator:
    """Shift pre-packed token chunks for next-token prediction (the ``causal_lm`` collator).

    Each sample's ``field`` holds L + 1 token ids (as ``build_shards`` text packing writes
    them). The batch is ``input_ids = tokens[:, :-1]``, ``labels = tokens[:, 1:]`` (both int64),
    ``attention_mask`` (int64 ones) and ``__key__`` when the samples have keys. With ``pad_id``,
    rows of different lengths are right-padded with it to the longest, input positions holding
    ``pad_id`` get attention 0 and label positions holding it get ``-100`` (ignored by the
    loss). Without ``pad_id`` all rows must have the same length. ``task_spec`` is accepted (as
    by every registered factory) and not used.
    """

    field: str = "tokens"
    pad_id: int | None = None
    task_spec: InitVar[TaskSpec | None] = None

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        field, pad_id = self.field, self.pad_id
        if not samples:
            raise ValueError("causal_lm: cannot collate an empty batch")
        rows = _token_rows(samples, field)
        length = max(r.size for r in rows)
        if pad_id is None:
            for i, r in enumerate(rows):
                if r.size != rows[0].size:
                    raise ValueError(
                        f"causal_lm: field {field!r} has {rows[0].size} tokens in sample "
                        f"{sample_key(samples[0], 0)} but {r.size} in sample "
                        f"{sample_key(samples[i], i)}; pass pad_id to pad rows of different "
                        "lengths"
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
        keys = keys_of(samples)
        if keys is not None:
            batch["__key__"] = keys
        return batch
