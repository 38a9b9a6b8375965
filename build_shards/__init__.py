"""Write side of wdsloader: turn raw data into WebDataset tar shards plus a split manifest."""

from build_shards.adopt import adopt  # the function: it wins over the module's name
from build_shards.build import build_shards
from build_shards.commit.lock import OutputLockedError
from build_shards.errors import BuildError, BuildWorkerError, OutputExistsError, SourceChangedError
from build_shards.layout.splits import hash_unit
from build_shards.options import (
    BuildOptions,
    LoaderDefaults,
    LockOptions,
    RayEngine,
    SampleOptions,
    ShardOptions,
)
from build_shards.ray_data import write_shards
from build_shards.sources import Source, open_source

__all__ = [
    "BuildError",
    "BuildOptions",
    "BuildWorkerError",
    "LoaderDefaults",
    "LockOptions",
    "OutputExistsError",
    "OutputLockedError",
    "RayEngine",
    "SampleOptions",
    "ShardOptions",
    "Source",
    "SourceChangedError",
    "adopt",
    "build_shards",
    "hash_unit",
    "open_source",
    "write_shards",
]
