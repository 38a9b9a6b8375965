"""The ``packed`` collator: documents -> fixed-width packed rows for causal language models.

The samples given are packed with :func:`wdsloader.plan.packing.plan_packs` (best-fit decreasing
over the whole list, or windows of ``window``); each row is ``max_tokens`` wide. A document
longer than ``max_tokens`` is cut into pieces (``too_long="split"``), each piece its own sequence.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wdsloader.collate.batch import IGNORE_INDEX, as_int_row, sample_key
from wdsloader.plan.packing import Pack, Packing, Piece, TooLong

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec


def _rows(samples: list[dict[str, Any]], field: str) -> list[np.ndarray]:
    rows = []
    for i, s in enumerate(samples):
        if field not in s:
            raise ValueError(
                f"packed: sample {sample_key(s, i)} has no field {field!r}; its fields: {sorted(s)}"
            )
        rows.append(as_int_row(s[field], field, s, i, "packed"))
    return rows


def _as_samples(batch: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    """Samples as dicts (a batch of columns cut into rows)."""
    if not isinstance(batch, dict):
        return batch
    names = list(batch)
    return [dict(zip(names, row, strict=True)) for row in zip(*batch.values(), strict=True)]


def _segments(packs: list[Pack], width: int) -> np.ndarray:
    """``cu_seqlens`` over the flattened rows: each piece a sequence, a row's padding one."""
    bounds = [0]
    for r, pack in enumerate(packs):
        at = r * width
        for piece in pack:
            if piece.length:
                at += piece.length
                bounds.append(at)
        if at < (r + 1) * width:
            bounds.append((r + 1) * width)
    return np.asarray(bounds, dtype=np.int32)


@dataclass(slots=True, frozen=True)
class PackedCollator:
    """Pack documents into rows of ``max_tokens`` tokens (the ``packed`` collator).

    The batch: ``input_ids`` (int64 ``[rows, max_tokens]``, ``pad_id`` after a row's tokens),
    ``position_ids`` restarting at 0 at each document (or piece of one), ``document_ids`` (the
    document's position in the samples given, -1 on padding: a block-diagonal mask is
    ``document_ids[:, :, None] == document_ids[:, None, :]``), ``attention_mask`` (1 on tokens),
    ``cu_seqlens`` (int32 bounds of the sequences in the flattened rows, each piece one sequence
    and each row's padding one, so the last bound is ``rows * max_tokens``: FlashAttention's
    varlen kernels) with ``max_seqlen``, and with ``labels=True`` ``labels`` as Hugging Face
    causal LMs take them (the model shifts): the tokens, -100 on each sequence's first token (it
    would be predicted across a boundary) and on padding. ``__key__`` lists the keys of each
    row's documents when the samples have keys. ``task_spec`` is accepted and not used.
    """

    max_tokens: int
    field: str = "input_ids"
    window: int | None = None  # None: best fit over all the samples given
    too_long: TooLong = "split"
    pad_id: int = 0
    labels: bool = True
    task_spec: InitVar[TaskSpec | None] = None

    def __post_init__(self, task_spec: TaskSpec | None) -> None:
        window = 1 if self.window is None else self.window
        Packing(max_tokens=self.max_tokens, field=self.field, window=window, too_long=self.too_long)
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise ValueError(f"packed: pad_id must be an int, got {self.pad_id!r}")

    @classmethod
    def from_packing(cls, packing: Packing, **options: Any) -> PackedCollator:
        """The collator packing as ``packing`` says (its window included)."""
        return cls(
            max_tokens=packing.max_tokens, field=packing.field, window=packing.window,
            too_long=packing.too_long, **options,
        )  # fmt: skip

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("packed: cannot collate an empty batch")
        docs = _rows(samples, self.field)
        window = self.window or len(docs)
        packing = Packing(
            max_tokens=self.max_tokens, field=self.field, window=window, too_long=self.too_long
        )
        packs = packing.plan([d.size for d in docs])
        return self._batch(samples, docs, packs)

    def collate_planned(
        self, batch: list[dict[str, Any]] | dict[str, Any], layout: list[Pack]
    ) -> dict[str, Any]:
        """The rows of a batch the plan packed (``create_loader(packing=...)``): ``layout`` is
        its packs, each piece's ``doc`` a split-wide sample id (``__index__``); ``batch`` the
        samples read (or their columns). A piece of a sample that was skipped is padding; a
        sample whose tokens do not end where its recorded length says (shorter than a piece, or
        longer than its last) is a ValueError naming its key."""
        samples = _as_samples(batch)
        by_index = {int(s["__index__"]): (i, s) for i, s in enumerate(samples)}
        docs: list[np.ndarray] = []
        meta: list[dict[str, Any]] = []
        where: dict[int, int] = {}
        rows: list[Pack] = []
        for pack in layout:
            row = []
            for piece in pack:
                if piece.doc not in by_index:
                    continue  # skipped (on_error="skip"): its tokens are padding
                i, sample = by_index[piece.doc]
                if piece.doc not in where:
                    (tokens,) = _rows([sample], self.field)
                    where[piece.doc] = len(docs)
                    docs.append(tokens)
                    meta.append({"__key__": sample.get("__key__")})
                size = docs[where[piece.doc]].size
                # a piece shorter than a row is the document's last: it ends where the tokens do
                if piece.stop > size or (piece.length < self.max_tokens and piece.stop != size):
                    raise ValueError(
                        f"packed: sample {sample_key(sample, i)} (split index {piece.doc}) "
                        f"has {size} tokens in {self.field!r}, but the plan packs its "
                        f"tokens up to {piece.stop} (its recorded length): the lengths side "
                        "file does not match the shard"
                    )
                row.append(Piece(where[piece.doc], piece.start, piece.stop))
            rows.append(tuple(row))
        out = self._batch(meta, docs, rows)
        ids = np.asarray(list(where), dtype=np.int64)
        doc_ids = out["document_ids"].numpy()
        doc_ids[doc_ids >= 0] = ids[doc_ids[doc_ids >= 0]]
        out["__index__"] = torch.from_numpy(ids)
        return out

    def _batch(
        self, samples: list[dict[str, Any]], docs: list[np.ndarray], packs: list[Pack]
    ) -> dict[str, Any]:
        shape = (len(packs), self.max_tokens)
        tokens = np.full(shape, self.pad_id, np.int64)
        positions = np.zeros(shape, np.int64)
        doc_ids = np.full(shape, -1, np.int64)
        starts = np.zeros(shape, bool)
        for r, pack in enumerate(packs):
            at = 0
            for piece in pack:
                stop = at + piece.length
                tokens[r, at:stop] = docs[piece.doc][piece.start : piece.stop]
                positions[r, at:stop] = np.arange(piece.length)
                doc_ids[r, at:stop] = piece.doc
                if piece.length:
                    starts[r, at] = True
                at = stop
        mask = doc_ids >= 0
        cu = _segments(packs, self.max_tokens)
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(tokens),
            "position_ids": torch.from_numpy(positions),
            "document_ids": torch.from_numpy(doc_ids),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
            "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0,
        }
        if self.labels:
            labels = tokens.copy()
            labels[~mask | starts] = IGNORE_INDEX
            batch["labels"] = torch.from_numpy(labels)
        if samples and "__key__" in samples[0]:
            batch["__key__"] = [[samples[p.doc].get("__key__") for p in pack] for pack in packs]
        return batch
