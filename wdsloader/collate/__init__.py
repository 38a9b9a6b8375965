"""Samples to batches: the collator registry, task specs and the built-in collators."""

from wdsloader.collate.batch import IGNORE_INDEX, CollateFn
from wdsloader.collate.causal_lm import CausalLMCollator
from wdsloader.collate.default import DefaultCollator
from wdsloader.collate.packed import PackedCollator
from wdsloader.collate.registry import CollatorInfo, CollatorRegistry
from wdsloader.collate.task import TaskSpec
from wdsloader.collate.text import TextCollator
from wdsloader.collate.vision import NORMALIZATIONS, VisionCollator

__all__ = [
    "IGNORE_INDEX",
    "NORMALIZATIONS",
    "CausalLMCollator",
    "CollateFn",
    "CollatorInfo",
    "CollatorRegistry",
    "DefaultCollator",
    "PackedCollator",
    "TaskSpec",
    "TextCollator",
    "VisionCollator",
]
