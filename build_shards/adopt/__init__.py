"""Adopt WebDataset shards written by other tools: an index beside each tar, a manifest, a card."""

from build_shards.adopt.index import adopt

__all__ = ["adopt"]
