"""Streaming writer of one shard: ustar members, sample offsets for the index, sha256, layout."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import BinaryIO

from wdsloader.format.index import encode_index
from wdsloader.format.keys import validate_key
from wdsloader.format.tar import BLOCK, END_OF_ARCHIVE, encode_header, member_size, padded

_ZEROS = bytes(BLOCK)


class TarStreamWriter:
    """Write samples to a binary file object and record what the index and manifest need.

    Each sample is ``(key, [(ext, data), ...])``; members are written in the given order, so the
    caller fixes the member order (the same in every sample). ``layout`` holds, for every
    extension whose data sits at the same offset from the sample start with the same size in
    every sample so far, ``[offset, size]``.
    """

    def __init__(self, fileobj: BinaryIO) -> None:
        self._f = fileobj
        self._sha = hashlib.sha256()
        self.offset = 0
        self.offsets: list[int] = []
        self.layout: dict[str, list[int]] | None = None
        self.closed = False

    @property
    def num_samples(self) -> int:
        return len(self.offsets)

    def projected_size(self, members: Sequence[tuple[str, bytes]]) -> int:
        """File size after adding this sample and closing."""
        return self.offset + sum(member_size(len(d)) for _, d in members) + len(END_OF_ARCHIVE)

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self._sha.update(data)
        self.offset += len(data)

    def write_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        validate_key(key)
        if not members:
            raise ValueError(f"sample {key!r} has no fields")
        parts: list[bytes] = []
        layout: dict[str, list[int]] = {}
        pos = 0
        for ext, data in members:
            size = len(data)
            parts.append(encode_header(f"{key}.{ext}", size))
            layout[ext] = [pos + BLOCK, size]
            parts.append(data)
            pad = padded(size) - size
            if pad:
                parts.append(_ZEROS[:pad])
            pos += BLOCK + size + pad
        self.offsets.append(self.offset)
        self._write(b"".join(parts))
        if self.layout is None:
            self.layout = layout
        else:
            self.layout = {k: v for k, v in self.layout.items() if layout.get(k) == v}

    def close(self) -> tuple[bytes, str]:
        """Write the end-of-archive blocks; returns ``(index_bytes, sha256_hex)``."""
        end = self.offset
        self._write(END_OF_ARCHIVE)
        self.closed = True
        return encode_index([*self.offsets, end]), self._sha.hexdigest()
