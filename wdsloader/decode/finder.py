"""Where the members of the fields a columnar batch does not gather lie: found by one walk over
the batch's headers (:mod:`wdsloader.decode.walk`), one walk per layout group when the batch's
samples come from shards of different layouts, else by parsing each sample.

A shard's layout decides where parsing starts in its samples (past the members at constant
offsets, or at the first header when a decoded field is one of them), so samples of shards
with different layouts (a ``.cls`` whose width is constant in some shards only, shards of
different builds) cannot be walked in one step; walked group by group they stay on the
whole-batch path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wdsloader.decode.batch import NotGatherable, RawBatch
from wdsloader.decode.registry import SampleDecoder
from wdsloader.decode.ungathered import Found, parse_members
from wdsloader.decode.walk import KeyNames, WalkSteps, walk_members, walk_steps
from wdsloader.format.manifest import ShardInfo
from wdsloader.format.ustar import BLOCK

MAX_WALKS = 64  # layout groups whose walks are remembered

Walked = dict[str, tuple[np.ndarray, np.ndarray]]


class MemberFinder:
    """Finds the members of the fields ``others`` (decoded by ``decoder``) in batches of
    ``shards``; ``walk_from[s]``: where the walk over the headers starts in the samples of
    shard ``s`` (:func:`wdsloader.decode.gather.walk_start`), ``parse_from[s]``: where parsing
    them one by one starts when a walk fails; ``sources`` names each shard in errors;
    ``layout_group[s]``: the layout group of shard ``s`` (:mod:`wdsloader.decode.layouts`),
    whose batches keep their walks' steps apart."""

    def __init__(
        self,
        shards: Sequence[ShardInfo],
        walk_from: np.ndarray,
        parse_from: np.ndarray,
        decoder: SampleDecoder,
        others: Sequence[str],
        sources: Sequence[str],
        layout_group: np.ndarray | None = None,
    ) -> None:
        self.walk_from = walk_from
        self.layout_group = walk_from if layout_group is None else layout_group
        self.parse_from = parse_from
        self.sources = sources
        self.wanted = {decoder.field_decoder(f)[0] for f in others}
        # per shard: its walk group (shards whose samples start the walk alike)
        self.walk_group = walk_groups(shards, walk_from)
        # per layout group (or walk group): the headers its last walk passed
        self.walks: dict[tuple[str, int], WalkSteps] = {}

    def find(
        self,
        raw: RawBatch,
        keys: list[str],
        names: np.ndarray,
        ends: np.ndarray,
        block: np.ndarray | None,
    ) -> Found | NotGatherable:
        """The members of the batch's samples (keys ``keys``; ``names``/``ends``: their first
        headers' name fields and where each key ends; ``block``: the batch's gathered prefix,
        if any): ``{ext: (data positions, sizes)}`` from a walk, else a list of each sample's
        parsed members, else why the batch does not parse."""
        groups = self.walk_group[raw.shard]
        starts = self.walk_from[raw.shard]
        walked = None
        if not len(groups) or (starts == starts[0]).all():
            # one walk when every sample starts it at the same offset (layouts that differ
            # only past that point walk alike); the steps kept per layout group (a batch of
            # several: per start offset)
            layouts = self.layout_group[raw.shard]
            if len(layouts) and (layouts == layouts[0]).all():
                key = ("batch", int(layouts[0]))
            else:  # samples of several layout groups: per start offset
                key = ("batch", -1 - (int(starts[0]) if len(starts) else 0))
            rows = np.arange(len(raw))
            walked = self._walk(raw, KeyNames(keys, names, ends), block, rows, key)
        if walked is None and len(groups) and not (groups == groups[0]).all():
            walked = self._walk_groups(raw, keys, names, ends, groups)
        if walked is None:
            return parse_members(raw, keys, self.parse_from[raw.shard], self.sources)
        return walked

    def _walk(
        self,
        raw: RawBatch,
        names: KeyNames,
        block: np.ndarray | None,
        rows: np.ndarray,
        group: tuple[str, int],
    ) -> Walked | None:
        """The members of the samples ``rows`` (of one start offset, or of one walk group:
        ``group`` keys the steps kept) found in one walk: in one pass where an earlier walk of
        the same key left its steps, else step by step."""
        assert raw.buf is not None
        walk_from = self.walk_from[raw.shard[rows]]
        starts, stops = raw.start[rows] + walk_from, raw.stop[rows]
        steps = self.walks.get(group)
        if steps is not None:
            members = walk_steps(raw.buf, starts, stops, names, steps)
            if members is not None:
                return members
        first = None
        if block is not None:
            at = int(walk_from[0])
            first = block[:, at : at + BLOCK] if block.shape[1] >= at + BLOCK else None
        first_checked = bool((walk_from == 0).all())
        walked = walk_members(raw.buf, starts, stops, names, first, first_checked)
        if walked is None:
            return None
        members, steps = walked
        if not steps.offsets:  # the headers lie elsewhere in each sample: no prediction
            self.walks.pop(group, None)
        elif group in self.walks or len(self.walks) < MAX_WALKS:
            self.walks[group] = steps
        return members

    def _walk_groups(
        self,
        raw: RawBatch,
        keys: list[str],
        names: np.ndarray,
        ends: np.ndarray,
        groups: np.ndarray,
    ) -> Walked | None:
        """The members of a batch whose samples come from shards of several walk groups: each
        group walked on its own, the members put back in batch order (None when a group's walk
        fails, or a decoded field's member is in some groups only)."""
        walks = []
        for group in np.unique(groups).tolist():
            rows = np.flatnonzero(groups == group)
            key_names = KeyNames([keys[j] for j in rows.tolist()], names[rows], ends[rows])
            found = self._walk(raw, key_names, None, rows, ("group", int(group)))
            if found is None:
                return None
            walks.append((rows, found))
        # a group walked from the sample's start finds the fixed-offset members too: keep the
        # members every group found; a decoded field's member must be in all groups or none
        common = set.intersection(*(set(found) for _, found in walks))
        if any(self.wanted & (set(found) - common) for _, found in walks):
            return None
        out: Walked = {}
        for ext in sorted(common):
            pos, size = np.zeros(len(raw), dtype=np.int64), np.zeros(len(raw), dtype=np.int64)
            for rows, found in walks:
                pos[rows], size[rows] = found[ext]
            out[ext] = (pos, size)
        return out


def walk_groups(shards: Sequence[ShardInfo], parse_from: np.ndarray) -> np.ndarray:
    """Per shard, the id of its walk group: shards with the same layout and the same place to
    start parsing (the variable members of their samples are found by one walk)."""
    ids: dict[tuple[Any, ...], int] = {}
    out = np.empty(len(shards), dtype=np.int64)
    for s, shard in enumerate(shards):
        layout = tuple(sorted((ext, tuple(v)) for ext, v in (shard.layout or {}).items()))
        out[s] = ids.setdefault((int(parse_from[s]), layout), len(ids))
    return out
