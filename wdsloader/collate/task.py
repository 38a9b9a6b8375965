"""``TaskSpec``: what a task feeds its model and learns from; its ``modality`` picks a collator."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Known values (others are allowed: a registered collator may serve a modality of its own).
TASK_TYPES = (
    "lm",
    "classification",
    "seq2seq",
    "text_classification",
    "vision_classification",
    "vision_multilabel",
)
MODALITIES = ("text", "vision", "audio", "tabular")


@dataclass
class TaskSpec:
    """A task's semantics, independent of any model: the batch fields the model reads
    (``input_fields``) and learns from (``target_field``), its loss and metrics, token roles
    (``special_tokens``, e.g. ``{"pad_token_id": 0}``), the ``modality`` that picks a collator
    from :class:`~wdsloader.collate.CollatorRegistry`, the shapes of its inputs and outputs
    (``input_schema``/``output_schema``) and the collator's options
    (``preprocessing_config``, e.g. ``{"normalize": "imagenet"}`` for ``vision``).

    ``task_type`` is one of :data:`TASK_TYPES` and ``modality`` one of :data:`MODALITIES` for
    the built-in collators; other values are allowed for collators registered by the user.
    The presets :meth:`lm_tiny`, :meth:`cls_tiny`, :meth:`seq2seq_tiny` and
    :meth:`vision_tiny` return a new spec each call.
    """

    name: str
    task_type: str
    model_family: str = "decoder_only"
    input_fields: list[str] = field(default_factory=lambda: ["input_ids", "attention_mask"])
    target_field: str | None = "labels"
    loss_type: str = "cross_entropy"
    metrics: list[str] = field(default_factory=lambda: ["loss"])
    special_tokens: dict[str, int] = field(default_factory=dict)
    additional_config: dict[str, Any] = field(default_factory=dict)
    modality: str = "text"
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] = field(default_factory=dict)
    preprocessing_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("name", "task_type", "modality"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"TaskSpec.{name} must be a non-empty string, got {value!r}")
        if isinstance(self.input_fields, str):
            raise TypeError(f"TaskSpec.input_fields is a list of names, got {self.input_fields!r}")
        self.input_fields = list(self.input_fields)
        self.metrics = list(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``TaskSpec.from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        """The spec :meth:`to_dict` wrote; an unknown key is a ValueError naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TaskSpec.from_dict: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)

    @classmethod
    def lm_tiny(cls) -> TaskSpec:
        """Causal language modelling (decoder-only), text: ``input_ids``/``attention_mask`` ->
        ``labels``; 128 tokens of a 50257-token vocabulary."""
        return cls(
            name="lm_tiny",
            task_type="lm",
            model_family="decoder_only",
            input_fields=["input_ids", "attention_mask"],
            target_field="labels",
            metrics=["loss", "perplexity", "accuracy"],
            special_tokens={"pad_token_id": 0},
            additional_config={"shift_labels": True},
            modality="text",
            input_schema={"max_seq_len": 128, "vocab_size": 50257},
            output_schema={"vocab_size": 50257},
        )

    @classmethod
    def cls_tiny(cls) -> TaskSpec:
        """Text classification (encoder-only) into 2 classes: ``labels`` holds the class."""
        return cls(
            name="cls_tiny",
            task_type="classification",
            model_family="encoder_only",
            input_fields=["input_ids", "attention_mask"],
            target_field="labels",
            metrics=["loss", "accuracy"],
            special_tokens={"pad_token_id": 0},
            additional_config={"num_classes": 2},
            modality="text",
            input_schema={"max_seq_len": 128, "vocab_size": 50257},
            output_schema={"num_classes": 2},
        )

    @classmethod
    def seq2seq_tiny(cls) -> TaskSpec:
        """Sequence to sequence (encoder-decoder): ``labels`` holds the target token ids."""
        return cls(
            name="seq2seq_tiny",
            task_type="seq2seq",
            model_family="encoder_decoder",
            input_fields=["input_ids", "attention_mask", "decoder_input_ids"],
            target_field="labels",
            metrics=["loss"],
            special_tokens={"pad_token_id": 0},
            additional_config={"teacher_forcing": True},
            modality="text",
            input_schema={"max_seq_len": 128, "vocab_size": 50257},
            output_schema={"vocab_size": 50257},
        )

    @classmethod
    def vision_tiny(cls) -> TaskSpec:
        """Image classification into 4 classes: ``pixel_values`` (3x32x32, channels first,
        ImageNet-normalised by the ``vision`` collator) -> ``labels``."""
        return cls(
            name="vision_tiny",
            task_type="vision_classification",
            model_family="encoder_only",
            input_fields=["pixel_values"],
            target_field="labels",
            metrics=["loss", "accuracy"],
            additional_config={"num_classes": 4},
            modality="vision",
            input_schema={"image_size": [3, 32, 32], "channels_first": True},
            output_schema={"num_classes": 4},
            preprocessing_config={"normalize": "imagenet"},
        )
