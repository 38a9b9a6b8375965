"""Editing a built dataset's shard in place, for tests of corrupt input."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wdsloader.format import BLOCK, Manifest, iter_members


def patch_shard(root, patch: Callable[[bytearray, np.ndarray], None]) -> str:
    """Apply ``patch(data, idx)`` to the bytes of the split ``train``'s first shard; returns its
    relative path."""
    shard = Manifest.load(root).split("train").shards[0]
    path = f"{root}/{shard.path}"
    data = bytearray(open(path, "rb").read())
    patch(data, np.fromfile(f"{root}/{shard.idx_path}", dtype="<u8").astype(np.int64))
    with open(path, "wb") as f:
        f.write(bytes(data))
    return shard.path


def header_of(data: bytes | bytearray, idx: np.ndarray, i: int, ext: str) -> int:
    """Offset of the header of sample ``i``'s member ``ext``."""
    (m,) = [
        m for m in iter_members(bytes(data), int(idx[i]), int(idx[i + 1])) if m.name.endswith(ext)
    ]
    return m.data_offset - BLOCK
