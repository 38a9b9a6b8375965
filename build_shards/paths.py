"""Names and places of a build's files: shard names, the ``_build/`` state folder, block records.

Shards are ``{split}/{prefix}-BBBBB-PPP.tar`` (B the block, P the part within the block; ``.tar.gz``
when compressed) with a ``.idx`` beside each; a shard being written carries :data:`TMP_MARK` in its name. A build that
replaces a complete dataset takes the other prefix of :data:`SHARD_PREFIXES`. ``_build/`` holds
``build.json`` (the build's fingerprint and options) and ``block-BBBBB.json`` per finished block.
"""

from __future__ import annotations

import os
import re

from wdsloader.io.storage import join

BUILD_DIR = "_build"
BUILD_FILE = "build.json"
TMP_MARK = ".tmp-"
SHARD_PREFIXES = ("shard", "shard-r")  # a replacing build takes the one the old dataset lacks
RECORD_RE = re.compile(r"^block-(\d{5,})\.json$")


def shard_name(block: int, part: int, prefix: str = "shard", compression: str | None = None) -> str:
    """File name of part ``part`` of block ``block`` (``.tar.gz`` when gzip-compressed)."""
    return f"{prefix}-{block:05d}-{part:03d}.tar{'' if compression is None else '.gz'}"


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
