"""The ``text`` collator: raw text or token ids -> dynamically padded ``input_ids``,
``attention_mask`` and ``labels`` (causal LM, masked LM, or the samples' own labels)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wdsloader.collate.batch import IGNORE_INDEX, as_int_row, check_batch, describe, sample_key
from wdsloader.collate.default import DefaultCollator

if TYPE_CHECKING:
    from wdsloader.collate.task import TaskSpec

PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")
MASK_TOKENS = ("[MASK]", "<mask>", "<|mask|>")
_DEFAULTS: dict[str, Any] = {
    "mlm": False,
    "mlm_probability": 0.15,
    "pad_to_multiple_of": None,
    "max_length": None,
    "padding_side": None,
    "pad_token_id": None,
    "add_special_tokens": True,
    "text_field": "text",
    "ids_field": "input_ids",
    "label_field": None,
}


def is_classification(task_spec: TaskSpec | None) -> bool:
    """True for a classification task (``classification``, ``text_classification`` ...)."""
    return task_spec is not None and task_spec.task_type.endswith("classification")


def is_tokenizers_lib(tokenizer: Any) -> bool:
    """True for a ``tokenizers.Tokenizer`` (as opposed to a ``transformers`` tokenizer)."""
    return hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size")


def _check_tokenizer(tokenizer: Any) -> None:
    if tokenizer is None:
        raise ValueError(
            "text: the text collator needs tokenizer= (a transformers tokenizer or a "
            "tokenizers.Tokenizer)"
        )
    if not is_tokenizers_lib(tokenizer) and not (
        callable(tokenizer) and hasattr(tokenizer, "pad_token_id")
    ):
        raise TypeError(
            f"text: tokenizer must be a transformers tokenizer or a tokenizers.Tokenizer, "
            f"got {type(tokenizer).__name__}"
        )


def _pad_id(tokenizer: Any, task_spec: TaskSpec | None) -> int | None:
    """The tokenizer's pad token id, else the task's ``special_tokens["pad_token_id"]``."""
    if is_tokenizers_lib(tokenizer):
        if tokenizer.padding is not None:
            return int(tokenizer.padding["pad_id"])
        for token in PAD_TOKENS:
            tid = tokenizer.token_to_id(token)
            if tid is not None:
                return int(tid)
    elif tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if task_spec is not None and "pad_token_id" in task_spec.special_tokens:
        return int(task_spec.special_tokens["pad_token_id"])
    return None


def _padding_side(tokenizer: Any) -> str:
    if is_tokenizers_lib(tokenizer):
        padding = tokenizer.padding
        return str(padding["direction"]) if padding is not None else "right"
    return str(getattr(tokenizer, "padding_side", "right"))


def _special_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids of the tokenizer's special tokens (never masked for MLM)."""
    if is_tokenizers_lib(tokenizer):
        added = tokenizer.get_added_tokens_decoder().items()
        return tuple(sorted(int(i) for i, t in added if t.special))
    return tuple(sorted(int(i) for i in tokenizer.all_special_ids))


def _mlm_collator(tokenizer: Any, pad_id: int, probability: float) -> Any:
    """``transformers.DataCollatorForLanguageModeling`` over the tokenizer (a
    ``tokenizers.Tokenizer`` is wrapped in ``PreTrainedTokenizerFast`` with its mask token)."""
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "text: mlm=True needs `transformers` (pip install transformers)"
        ) from None
    if is_tokenizers_lib(tokenizer):
        mask = next((t for t in MASK_TOKENS if tokenizer.token_to_id(t) is not None), None)
        if mask is None:
            raise ValueError(
                f"text: mlm=True needs a mask token; the tokenizer has none of {list(MASK_TOKENS)}"
            )
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, mask_token=mask, pad_token=tokenizer.id_to_token(pad_id)
        )
    elif tokenizer.mask_token is None:
        raise ValueError("text: mlm=True needs a tokenizer with a mask token (mask_token is None)")
    return transformers.DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm=True, mlm_probability=probability
    )


class TextCollator:
    """The ``text`` collator: each sample's ``text_field`` (a str, tokenized here) or
    ``ids_field`` (token ids: list, array or tensor) -> ``input_ids`` padded to the longest in
    the batch (rounded up to ``pad_to_multiple_of``; cut to ``max_length`` first) and
    ``attention_mask`` (1 on tokens, 0 on padding), both int64.

    ``labels``: the samples' own ``label_field`` when they carry it (class ids -> int64;
    token sequences, e.g. seq2seq targets, padded with -100); else with ``mlm=True`` the masking
    of ``transformers.DataCollatorForLanguageModeling`` (-100 off the masked positions; padding
    and special tokens are never masked); else causal LM: ``input_ids`` with -100 on padding
    (the model shifts). Other fields go through :class:`~wdsloader.collate.DefaultCollator`,
    with ``optional`` (the schema's optional fields: the loader passes them) kept as lists.

    ``tokenizer``: a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. The pad id is
    ``pad_token_id``, else the tokenizer's pad token, else ``task_spec.special_tokens
    ["pad_token_id"]``; ``padding_side`` defaults to the tokenizer's. Options come from the
    keyword arguments, else ``task_spec.preprocessing_config`` (same keys); ``label_field``
    defaults to ``task_spec.target_field``, else ``"labels"``.

    A classification task (``task_spec.task_type`` ending in ``classification``) never gets
    language-model labels: ``labels`` holds the class ids (int64, shape (B,); or multi-label
    vectors of one length, stacked) of ``label_field`` when given, else of the first of
    ``task_spec.target_field``, ``"labels"`` and ``"label"`` (the Hugging Face column name)
    that the samples carry, and that field is not repeated in the batch. Samples carrying none
    of them, or a value that is not a class id, are a ValueError naming the fields and the
    sample; ``mlm=True`` with a classification task is a ValueError.
    """

    def __init__(
        self,
        task_spec: TaskSpec | None = None,
        *,
        tokenizer: Any = None,
        mlm: bool | None = None,
        mlm_probability: float | None = None,
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        padding_side: str | None = None,
        pad_token_id: int | None = None,
        add_special_tokens: bool | None = None,
        text_field: str | None = None,
        ids_field: str | None = None,
        label_field: str | None = None,
        optional: Iterable[str] = (),
    ) -> None:
        _check_tokenizer(tokenizer)
        self.rest = DefaultCollator(optional=optional)
        given: dict[str, Any] = dict(
            mlm=mlm, mlm_probability=mlm_probability, pad_to_multiple_of=pad_to_multiple_of,
            max_length=max_length, padding_side=padding_side, pad_token_id=pad_token_id,
            add_special_tokens=add_special_tokens, text_field=text_field, ids_field=ids_field,
            label_field=label_field,
        )  # fmt: skip
        config = task_spec.preprocessing_config if task_spec is not None else {}
        o: dict[str, Any] = {
            k: v if v is not None else config.get(k, _DEFAULTS[k]) for k, v in given.items()
        }
        self.tokenizer = tokenizer
        self.mlm, self.add_special_tokens = bool(o["mlm"]), bool(o["add_special_tokens"])
        self.text_field: str = o["text_field"]
        self.ids_field: str = o["ids_field"]
        target = task_spec.target_field if task_spec is not None else None
        self.task_name = task_spec.name if task_spec is not None else None
        self.task_type = task_spec.task_type if task_spec is not None else None
        self.classification = is_classification(task_spec)
        if self.classification and self.mlm:
            raise ValueError(
                f"text: mlm=True makes token labels, but task {self.task_name!r} is a "
                f"classification task (task_type {self.task_type!r})"
            )
        candidates = (target, "labels", "label") if self.classification else (target, "labels")
        named = (o["label_field"],) if o["label_field"] else candidates
        self.label_fields: tuple[str, ...] = tuple(dict.fromkeys(f for f in named if f))
        self.label_field: str = self.label_fields[0]
        for name in ("pad_to_multiple_of", "max_length"):
            if o[name] is not None and (not isinstance(o[name], int) or o[name] < 1):
                raise ValueError(f"text: {name} must be a positive int, got {o[name]!r}")
        self.pad_to_multiple_of: int | None = o["pad_to_multiple_of"]
        self.max_length: int | None = o["max_length"]
        self.padding_side: str = o["padding_side"] or _padding_side(tokenizer)
        if self.padding_side not in ("right", "left"):
            raise ValueError(
                f"text: padding_side must be 'right' or 'left', got {self.padding_side!r}"
            )
        pad = o["pad_token_id"] if o["pad_token_id"] is not None else _pad_id(tokenizer, task_spec)
        if pad is None:
            raise ValueError(
                "text: the tokenizer has no pad token; pass pad_token_id= (e.g. the EOS id) or "
                "set the tokenizer's pad token"
            )
        self.pad_id = int(pad)
        self.special_ids = _special_ids(tokenizer)
        probability = o["mlm_probability"]
        self.masker = _mlm_collator(tokenizer, self.pad_id, probability) if self.mlm else None

    # -- rows of token ids ----------------------------------------------------------------------
    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        tok, special = self.tokenizer, self.add_special_tokens
        if is_tokenizers_lib(tok):
            out = []
            for enc in tok.encode_batch(texts, add_special_tokens=special):
                ids = np.asarray(enc.ids, dtype=np.int64)  # drop any padding the tokenizer adds
                out.append(ids[np.asarray(enc.attention_mask, dtype=bool)])
            return out
        return [
            np.asarray(r, np.int64) for r in tok(texts, add_special_tokens=special)["input_ids"]
        ]

    def _rows(self, samples: list[dict[str, Any]], names: Sequence[str]) -> list[np.ndarray]:
        if self.ids_field in names:
            f = self.ids_field
            rows = [as_int_row(s[f], f, s, i, "text") for i, s in enumerate(samples)]
        elif self.text_field in names:
            texts = [s[self.text_field] for s in samples]
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise ValueError(
                        f"text: field {self.text_field!r} of sample {sample_key(samples[i], i)} "
                        f"must be a str, got {describe(t)}"
                    )
            rows = self._encode(texts)
        else:
            raise ValueError(
                f"text: sample {sample_key(samples[0], 0)} has neither {self.text_field!r} "
                f"(text) nor {self.ids_field!r} (token ids); its fields: {sorted(names)}"
            )
        return [r[: self.max_length] for r in rows] if self.max_length else rows

    def _pad(self, rows: list[np.ndarray], value: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(padded ids, attention mask) of rows padded to the batch length."""
        length = max((r.size for r in rows), default=0)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = np.full((len(rows), length), value, np.int64)
        mask = np.zeros((len(rows), length), np.int64)
        for i, r in enumerate(rows):
            part = (
                slice(length - r.size, length) if self.padding_side == "left" else slice(0, r.size)
            )
            ids[i, part], mask[i, part] = r, 1
        return torch.from_numpy(ids), torch.from_numpy(mask)

    # -- labels ---------------------------------------------------------------------------------
    def _label_field(self, samples: list[dict[str, Any]], names: Sequence[str]) -> str | None:
        """The field the labels come from: the first of ``label_fields`` the samples carry."""
        found = next((f for f in self.label_fields if f in names), None)
        if found is None and self.classification:
            raise ValueError(
                f"text: task {self.task_name!r} is a classification task (task_type "
                f"{self.task_type!r}): its class ids come from one of the fields "
                f"{list(self.label_fields)}, but sample {sample_key(samples[0], 0)} has only "
                f"{sorted(names)}; name the field with label_field= (or the task's target_field)"
            )
        return found

    def _class_ids(self, samples: list[dict[str, Any]], f: str) -> torch.Tensor:
        """Class ids (int64, (B,)) or multi-label vectors of one length (stacked)."""
        arrays: list[np.ndarray] = []
        for i, s in enumerate(samples):
            v = s[f]
            a = np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v)
            scalar = a.ndim == 0 and a.dtype.kind in "iub"
            vector = a.ndim == 1 and a.dtype.kind in "iubf"
            if not (scalar or vector) or (arrays and a.shape != arrays[0].shape):
                raise ValueError(
                    f"text: field {f!r} of sample {sample_key(s, i)} must hold an integer class "
                    f"id or a multi-label vector of one length (classification task "
                    f"{self.task_name!r}), got {describe(v)}"
                )
            arrays.append(a)
        stacked = np.stack(arrays)
        if stacked.dtype.kind == "f":
            return torch.from_numpy(stacked.astype(np.float32))
        return torch.from_numpy(stacked.astype(np.int64))

    def _sample_labels(self, samples: list[dict[str, Any]], f: str) -> torch.Tensor:
        values = [s[f] for s in samples]
        arrays = [np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v) for v in values]
        if all(a.ndim == 0 and a.dtype.kind in "iub" for a in arrays):
            return torch.from_numpy(np.stack(arrays).astype(np.int64))
        rows = [as_int_row(s[f], f, s, i, "text") for i, s in enumerate(samples)]
        return self._pad(rows, IGNORE_INDEX)[0]

    def _masked(
        self, masker: Any, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input ids, labels): padding and special tokens are never masked."""
        special = mask == 0
        if self.special_ids:
            special |= torch.isin(ids, torch.tensor(self.special_ids, dtype=ids.dtype))
        inputs, labels = masker.torch_mask_tokens(ids.clone(), special_tokens_mask=special)
        return inputs, labels

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        names = check_batch(samples, "text")
        used = self.ids_field if self.ids_field in names else self.text_field
        ids, mask = self._pad(self._rows(samples, names), self.pad_id)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        label = self._label_field(samples, names)
        if label is not None:
            if self.mlm:
                raise ValueError(
                    f"text: mlm=True makes the labels, but the samples carry {label!r}"
                )
            own = self._class_ids if self.classification else self._sample_labels
            batch["labels"] = own(samples, label)
        elif self.masker is not None:
            batch["input_ids"], batch["labels"] = self._masked(self.masker, ids, mask)
        else:
            batch["labels"] = ids.masked_fill(mask == 0, IGNORE_INDEX)
        rest = [n for n in names if n not in (used, "attention_mask", label)]
        if rest:
            batch.update(self.rest([{n: s[n] for n in rest} for s in samples]))
        return batch

    def __repr__(self) -> str:
        return (
            f"TextCollator(tokenizer={type(self.tokenizer).__name__}, pad_id={self.pad_id}, "
            f"mlm={self.mlm}, pad_to_multiple_of={self.pad_to_multiple_of}, "
            f"max_length={self.max_length}, padding_side={self.padding_side!r})"
        )
