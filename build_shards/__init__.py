"""Write side of wdsloader: turn raw data into WebDataset tar shards plus a split manifest."""

from build_shards.build import build_shards

__all__ = ["build_shards"]
