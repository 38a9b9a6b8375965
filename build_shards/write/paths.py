"""Names and places of a build's files: shard names, the ``_build/`` state folder, block records.

Shards are ``{split}/{split}-BBBBB-PPP.tar`` (B the block, P the part within the block; ``.tar.gz``
when compressed) with their index beside each (:func:`wdsloader.format.index_path`); a shard being
written carries :data:`TMP_MARK` in its name. The split is in the file name, not only in the folder,
so that readers which cache shards by file name (webdataset's and wids' ``cache_dir``) never mix
the splits up. A build that replaces a complete dataset takes the other prefix of
:data:`SHARD_PREFIXES`. Datasets and unfinished builds of earlier versions used the prefix
``shard`` (``train/shard-00000-000.tar``); they still read and resume. ``_build/`` holds
``build.json`` (the build's fingerprint and options) and ``block-BBBBB.json`` per finished block.
"""

from __future__ import annotations

import os
import re

from wdsloader.format import ShardInfo
from wdsloader.io.storage import join

BUILD_DIR = "_build"
BUILD_FILE = "build.json"
TMP_MARK = ".tmp-"
SPLIT_FIELD = "{split}"
SHARD_PREFIXES = (SPLIT_FIELD, SPLIT_FIELD + "-r")  # a replacing build takes the one the old lacks
LEGACY_PREFIXES = ("shard", "shard-r")  # of the shards earlier versions wrote
RECORD_RE = re.compile(r"^block-(\d{5,})\.json$")


def shard_name(
    block: int,
    part: int,
    prefix: str = SHARD_PREFIXES[0],
    compression: str | None = None,
    *,
    split: str,
) -> str:
    """File name of part ``part`` of block ``block`` of ``split`` (``.tar.gz`` when
    gzip-compressed); ``{split}`` in ``prefix`` stands for the split's name."""
    stem = prefix.replace(SPLIT_FIELD, split)
    return f"{stem}-{block:05d}-{part:03d}.tar{'' if compression is None else '.gz'}"


def shard_files(info: ShardInfo) -> tuple[str, ...]:
    """The files of a shard, relative to the root: the shard, its index, its key index and
    its lengths (the last two when it has them)."""
    extra = tuple(p for p in (info.keys_path, info.lengths_path) if p is not None)
    return (info.path, info.idx_path, *extra)


def record_path(root: str, block: int) -> str:
    """Path of a finished block's record."""
    return join(root, BUILD_DIR, f"block-{block:05d}.json")


def build_file_path(root: str) -> str:
    """Path of the unfinished build's ``build.json``."""
    return join(root, BUILD_DIR, BUILD_FILE)


def remove_quietly(path: str) -> None:
    """Remove a local file; a missing one (or any OS error) is ignored."""
    try:
        os.remove(path)
    except OSError:
        pass
