"""The end of a build: the manifest's splits from the block records (duplicate keys across
blocks refused) and ``manifest.build``."""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from build_shards.commit.state import OutputState
from build_shards.errors import BuildError
from build_shards.layout.params import BuildParams
from build_shards.write.records import BlockRecord
from wdsloader.format import Manifest, ShardInfo, SplitInfo

log = logging.getLogger("build_shards")


def merge(
    records: Mapping[int, BlockRecord],
    names: tuple[str, ...],
    state: OutputState,
    packed: Mapping[str, list[tuple[tuple[int, int], ShardInfo]]] | None = None,
) -> Manifest:
    """The manifest's splits from the block records and the ``packed`` remainders (see
    :mod:`build_shards.write.rests`), in source order (block, then part); duplicate keys refused."""
    placed: dict[str, list[tuple[tuple[int, int], ShardInfo]]] = {}
    for split, packed_shards in (packed or {}).items():
        placed.setdefault(split, []).extend(packed_shards)
    hashes: dict[str, list[np.ndarray]] = {}
    owners: dict[str, list[tuple[int, int]]] = {}
    for b in sorted(records):
        rec = records[b]
        for split, shards in rec.splits.items():
            placed.setdefault(split, []).extend(((b, p), s) for p, s in enumerate(shards))
        for split, arr in (rec.key_hashes or {}).items():
            hashes.setdefault(split, []).append(arr)
            owners.setdefault(split, []).append((b, len(arr)))
    splits: dict[str, SplitInfo] = {name: SplitInfo() for name in names}
    for split, in_order in placed.items():
        in_order.sort(key=lambda placed_shard: placed_shard[0])
        splits.setdefault(split, SplitInfo()).shards.extend(s for _, s in in_order)
    for split, parts in hashes.items():
        _check_duplicates(split, parts, owners[split], state)
    if not any(s.num_samples for s in splits.values()):
        raise BuildError("no samples were written (map dropped every item)")
    return Manifest(splits=splits)


def _check_duplicates(
    split: str, parts: list[np.ndarray], owners: list[tuple[int, int]], state: OutputState
) -> None:
    """Raise a BuildError naming a key that two blocks of ``split`` share."""
    if len(parts) < 2:
        return
    allh = np.concatenate(parts)
    order = np.sort(allh)
    dup = np.unique(order[1:][order[1:] == order[:-1]])
    if not dup.size:
        return
    blocks = np.repeat([b for b, _ in owners], [n for _, n in owners])
    suspects = np.unique(blocks[np.isin(allh, dup)])
    seen: set[str] = set()
    dupset = set(dup.tolist())
    for b in suspects.tolist():
        for key in state.record_keys(int(b)).get(split, []):
            if hash(key) in dupset:
                if key in seen:
                    raise BuildError(f"duplicate key {key!r} in split {split!r}")
                seen.add(key)


def manifest_build(params: BuildParams, records: Mapping[int, BlockRecord]) -> dict[str, Any]:
    """``manifest.build``: the build's parameters and counts."""
    total_nan = sum(r.nan_samples for r in records.values())
    if total_nan:
        log.warning("%d samples hold NaN or Inf values (SampleOptions(allow_nan=True))", total_nan)
    return {
        **params.manifest_build(),
        "nan_samples": total_nan,
        "dropped_by_map": sum(r.skipped for r in records.values()),
        "source": {
            "kind": params.source_kind,
            "num_items": sum(r.num_items for r in records.values()),
        },
        "num_blocks": len(records),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
