"""Ray Data out: :func:`write_shards`, the end of a Ray Data pipeline written as our shards.

Ray Data's own ``write_webdataset`` names its files at random, writes no manifest and no index,
and its output depends on the block layout. :func:`write_shards` is :func:`build_shards` on the
dataset with ``engine="ray"``: each Ray task writes the shards of a fixed range of rows (the
dataset's order, see :mod:`build_shards.sources.raydata`), under deterministic names
(``{split}/{split}-BBBBB-PPP.tar``), each published complete, and ``manifest.json`` is written last,
once every shard is; an interrupted write resumes on rerun. ``ray`` is imported only when it runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from build_shards.build import build_shards
from wdsloader.format import Manifest


def write_shards(ds: Any, output: str | os.PathLike[str], **options: Any) -> Manifest:
    """Write the ``ray.data.Dataset`` ``ds`` to ``output`` (a folder every node reaches, or an
    fsspec URL such as ``s3://``) as WebDataset shards with their indexes and ``manifest.json``;
    the manifest. ``options``: those of :func:`build_shards` (``splits=``, ``map=``,
    ``shards=ShardOptions(...)``, ``samples=SampleOptions(key_field=...)``, ...); ``engine``
    defaults to ``"ray"`` (``RayEngine(address=...)`` for another cluster). The same rows in the
    same order give the same bytes, whatever the dataset's blocks."""
    ray_data = sys.modules.get("ray.data")
    if ray_data is None or not isinstance(ds, ray_data.Dataset):
        raise TypeError(
            f"write_shards writes a ray.data.Dataset, got {type(ds).__qualname__}: use "
            "build_shards for other sources"
        )
    options.setdefault("engine", "ray")
    return build_shards(ds, output, **options)
