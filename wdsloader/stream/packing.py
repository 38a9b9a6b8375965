"""``create_loader(packing=...)``: a resolved :class:`~wdsloader.stream.config.LoaderConfig`
turned into one that plans packed rows (:class:`~wdsloader.plan.PackPlanner`) from the lengths
the build recorded beside the shards, collated by the ``packed`` collator."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from wdsloader import plan
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest
from wdsloader.format.lengths import LENGTHS_FIELD
from wdsloader.io.fetch import ShardStore
from wdsloader.io.side_files import read_split_lengths
from wdsloader.plan.packing import DocumentTooLongError, Packing
from wdsloader.stream.config import LoaderConfig

__all__ = ["packed_config", "packing_fingerprint"]

_PACKING_KEYS = ("max_tokens", "field", "window", "too_long")


def packing_fingerprint(planner: plan.PackPlanner) -> str:
    """The ``packing`` part of a loader state's fingerprint: the options and a digest of the
    lengths (other lengths would put other documents in a saved state's packs)."""
    p = planner.packing
    digest = hashlib.sha256(planner.lengths.astype("<u4").tobytes()).hexdigest()[:12]
    return f"max_tokens={p.max_tokens},field={p.field},window={p.window},too_long={p.too_long},lengths={digest}"


def _check(
    config: LoaderConfig, packing: Packing, manifest: Manifest, where: str, collate_fn: object
) -> None:
    if collate_fn is not None and collate_fn != "packed":
        raise ValueError(
            f"packing= collates with the 'packed' collator; collate_fn={collate_fn!r} would "
            "be unused (pass collate_fn=None or 'packed'; its pad_id and labels go in "
            "DecodeOptions(collate_options=...))"
        )
    fixed = sorted(set(config.collate_options) & set(_PACKING_KEYS))
    if fixed:
        raise ValueError(
            f"collate_options {fixed} are set by packing=Packing(...): give them there"
        )
    if config.fields is not None and packing.field not in config.fields:
        raise ValueError(
            f"packing field {packing.field!r} is not among the decoded fields {list(config.fields)}"
        )
    recorded = manifest.build.get(LENGTHS_FIELD)
    if recorded != packing.field:
        raise ShardFormatError(
            f"{where}: packing=Packing(field={packing.field!r}) needs the lengths of "
            f"{packing.field!r} recorded at build time, but the manifest records "
            + ("none" if recorded is None else f"those of {recorded!r}")
            + f" (build with samples=SampleOptions(lengths={packing.field!r}))"
        )


def _too_long(lengths: np.ndarray, packing: Packing, manifest: Manifest, split: str) -> None:
    """Refuse (``too_long="error"``) a document over ``max_tokens``, naming its shard."""
    over = np.flatnonzero(lengths > packing.max_tokens)
    if packing.too_long != "error" or not over.size:
        return
    gid = int(over[0])
    shards = manifest.split(split).shards
    starts = np.cumsum([0, *(s.num_samples for s in shards)])
    s = int(np.searchsorted(starts, gid, side="right") - 1)
    raise DocumentTooLongError(
        f"shard {shards[s].path}: sample #{gid - int(starts[s])} has {int(lengths[gid])} "
        f"tokens of {packing.field!r}, more than max_tokens={packing.max_tokens} "
        f'({over.size} such samples in split {split!r}; too_long="split" cuts them into pieces)'
    )


def packed_config(
    config: LoaderConfig,
    packing: Packing,
    manifest: Manifest,
    store: ShardStore,
    collate_fn: object = None,
) -> LoaderConfig:
    """``config`` planning packed rows: the split's lengths read (not its samples), checked
    (the manifest records ``packing.field``'s lengths; none too long with
    ``too_long="error"``; ``collate_fn``, the one the user gave, None or ``"packed"``), and
    the ``packed`` collator made with ``packing``'s options."""
    where = f"dataset {store.redact(store.root)}"
    _check(config, packing, manifest, where, collate_fn)
    lengths = read_split_lengths(store, manifest.split(config.split).shards)
    _too_long(lengths, packing, manifest, config.split)
    planner = plan.PackPlanner(config.plan, packing, lengths)
    options: dict[str, Any] = {
        **config.collate_options,
        **{k: getattr(packing, k) for k in _PACKING_KEYS},
    }
    mean = float(lengths.mean()) if lengths.size else 1.0
    docs_per_batch = max(1.0, config.plan.batch_size * packing.max_tokens / max(mean, 1.0))
    readahead = max(1, int(max(config.plan.window, 1) // docs_per_batch))
    return dataclasses.replace(
        config, packing=planner, collate="packed", collate_options=options,
        readahead_batches=readahead,
    )  # fmt: skip
