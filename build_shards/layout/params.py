"""The options of a build that decide its bytes: one source for the resume fingerprint and for
``manifest.build``, so the two cannot drift apart."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wdsloader.format import FORMAT_VERSION, FieldSpec

BLOCK_SHARDS = 4  # full shards per block, at most
MIN_BLOCKS = 16  # blocks a build of known length is cut into, at least (when big enough)
MIN_BLOCK_BYTES = 4 * 2**20  # tar bytes a block holds, at least (unless it is one full shard)
TAR_BLOCK = 512


def sample_tar_bytes(members: list[tuple[str, bytes]]) -> int:
    """About the tar bytes of one encoded sample: a 512-byte header per member plus its data
    padded to 512 (a name too long for one header costs a little more)."""
    return sum(TAR_BLOCK + -(-len(data) // TAR_BLOCK) * TAR_BLOCK for _, data in members)


def default_block_size(
    length: int | None, sample_bytes: int, shard_max_count: int, shard_max_bytes: int
) -> int:
    """The number of source items per block when ``block_size`` is not given.

    A block holds at most :data:`BLOCK_SHARDS` full shards (``shard_max_count`` samples or
    ``shard_max_bytes`` of samples of ``sample_bytes``, whichever is fewer), so big samples do
    not make huge blocks. A source of known ``length`` is cut into at least :data:`MIN_BLOCKS`
    blocks, so the workers of a small build have blocks to share, while a block keeps at least
    :data:`MIN_BLOCK_BYTES` of samples (or one full shard) so small datasets are not cut into
    tiny shards (nor longer than the source). The rule depends on the data and the shard
    limits only, never on the number of workers: the shards are the same whatever ``workers``
    is.
    """
    per_shard = max(1, min(shard_max_count, shard_max_bytes // max(1, sample_bytes)))
    block = BLOCK_SHARDS * per_shard
    if length is not None:
        floor = min(per_shard, max(1, MIN_BLOCK_BYTES // max(1, sample_bytes)))
        block = min(block, max(floor, math.ceil(length / MIN_BLOCKS)), length)
    return max(1, block)


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildParams:
    """A build's parameters once the source is open and the schema known."""

    source: Mapping[str, Any]  # the source's identity (``Source.describe()``)
    source_kind: str
    map_name: str | None  # the qualified name of ``map``
    key_field: str
    splits: Mapping[str, Any]  # the splitter's spec
    split_field: str | None
    group_by: str | None
    seed: int
    shard_max_count: int
    shard_max_bytes: int
    block_size: int
    allow_nan: bool
    schema: Mapping[str, FieldSpec]
    dims: Mapping[str, int]
    compression: str | None = None
    lengths_field: str | None = None  # whose lengths the shards record

    def options(self) -> dict[str, Any]:
        """What the fingerprint hashes, as JSON values (``build.json`` keeps it, to name the
        options that differ when a rerun is refused)."""
        options = {
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "map": self.map_name,
            "key_field": self.key_field,
            "splits": self.splits,
            "seed": self.seed,
            "shard_max_count": self.shard_max_count,
            "shard_max_bytes": self.shard_max_bytes,
            "block_size": self.block_size,
            "allow_nan": self.allow_nan,
            "schema": {f: spec_dict(s) for f, s in self.schema.items()},
            "dims": self.dims,
        }
        if self.compression is not None:  # absent otherwise: older builds keep their fingerprint
            options["compression"] = self.compression
        if self.lengths_field is not None:  # absent otherwise, likewise
            options["lengths_field"] = self.lengths_field
        result: dict[str, Any] = json.loads(json.dumps(options, default=str))
        return result

    def fingerprint(self) -> str:
        """A hash of :meth:`options`: a rerun resumes only a build with the same one."""
        return hashlib.sha256(json.dumps(self.options(), sort_keys=True).encode()).hexdigest()

    def manifest_build(self) -> dict[str, Any]:
        """The parameters ``manifest.build`` starts with (the counts follow)."""
        return {
            "builder": "build_shards",
            "seed": self.seed,
            "shard_max_count": self.shard_max_count,
            "shard_max_bytes": self.shard_max_bytes,
            "block_size": self.block_size,
            "splits": self.splits,
            "group_by": self.group_by,
            "split_field": self.split_field,
            "key_field": self.key_field,
            "allow_nan": self.allow_nan,
            **({} if self.compression is None else {"compression": self.compression}),
            **({} if self.lengths_field is None else {"lengths_field": self.lengths_field}),
        }


def callable_name(fn: Any) -> str | None:
    """``module.qualname`` of a callable (None for None)."""
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def spec_dict(spec: FieldSpec) -> dict[str, Any]:
    """A field spec as JSON, without its unset attributes."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}
