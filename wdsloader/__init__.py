"""wdsloader: stream WebDataset shards into PyTorch with exact DDP splitting and exact resume.

The read side of the project; :mod:`wdsloader.format` is the on-disk contract that
``build_shards`` writes.
"""

from wdsloader.collate import get_collator, list_collators, register_collator
from wdsloader.dataset import ShardStreamDataset
from wdsloader.decode import SampleDecoder, get_decoder, parse_sample, register_decoder
from wdsloader.errors import (
    DecodeError,
    ManifestError,
    PickleNotAllowedError,
    SchemaError,
    ShardFormatError,
    WdsLoaderError,
)
from wdsloader.fetch import ReadOptions, ShardStore
from wdsloader.format import FieldSpec, Manifest, ShardInfo, SplitInfo
from wdsloader.loader import DevicePrefetcher, WdsDataLoader, create_loader, set_epoch
from wdsloader.plan import PlanConfig, Resume

__version__ = "0.1.0"

__all__ = [
    "DecodeError",
    "DevicePrefetcher",
    "FieldSpec",
    "Manifest",
    "ManifestError",
    "PickleNotAllowedError",
    "PlanConfig",
    "ReadOptions",
    "Resume",
    "SampleDecoder",
    "SchemaError",
    "ShardFormatError",
    "ShardInfo",
    "ShardStore",
    "ShardStreamDataset",
    "SplitInfo",
    "WdsDataLoader",
    "WdsLoaderError",
    "create_loader",
    "get_collator",
    "get_decoder",
    "list_collators",
    "parse_sample",
    "register_collator",
    "register_decoder",
    "set_epoch",
]
