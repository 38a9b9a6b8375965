"""Samples to batches: the collator registry and the built-in collators."""

from wdsloader.collate.collators import (
    IGNORE_INDEX,
    CausalLMCollator,
    CollateFn,
    CollatorInfo,
    DefaultCollator,
    causal_lm_collator,
    default_collator,
    get_collator,
    list_collators,
    register_collator,
)

__all__ = [
    "IGNORE_INDEX",
    "CausalLMCollator",
    "CollateFn",
    "CollatorInfo",
    "DefaultCollator",
    "causal_lm_collator",
    "default_collator",
    "get_collator",
    "list_collators",
    "register_collator",
]
