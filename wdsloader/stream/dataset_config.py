"""What a :class:`~wdsloader.stream.dataset.ShardStreamDataset` is made from: the
:class:`~wdsloader.stream.config.LoaderConfig` (the keywords of earlier versions translated into
one, with a ``DeprecationWarning``), and the decoder, collate function and plan it describes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from wdsloader import plan
from wdsloader.decode.registry import SampleDecoder
from wdsloader.format import Manifest
from wdsloader.lazy import REMOVED_IN
from wdsloader.mix.runtime import MixPlanner
from wdsloader.stream.config import LoaderConfig, make_collate

__all__ = [
    "ON_ERROR",
    "check_config",
    "dataset_collate",
    "dataset_decoder",
    "dataset_planner",
    "loader_config",
]

Collate = Callable[[list[dict[str, Any]]], Any]

ON_ERROR = ("raise", "skip")

_REQUIRED = object()

# the constructor's earlier keywords besides manifest, store, config, decoder and collate_fn,
# with their defaults
_OLD_KEYWORDS: dict[str, Any] = {
    "split": _REQUIRED, "rank": _REQUIRED, "on_error": "raise", "readahead_batches": 1,
    "curriculum": None, "gather": True, "max_skipped": None, "mix": None,
}  # fmt: skip


def check_config(config: LoaderConfig) -> None:
    """A ValueError naming the option of ``config`` a dataset cannot take."""
    if config.on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {config.on_error!r}")
    max_skipped = config.max_skipped
    if max_skipped is not None and (isinstance(max_skipped, bool) or max_skipped < 0):
        raise ValueError(f"max_skipped must be None or >= 0, got {max_skipped!r}")
    if not 0 <= config.rank < config.plan.world_size:
        raise ValueError(f"rank {config.rank} outside [0, {config.plan.world_size})")


def dataset_decoder(config: LoaderConfig, manifest: Manifest) -> SampleDecoder:
    """The decoder of ``config``'s fields over ``manifest``'s schema."""
    return SampleDecoder(
        manifest.schema or None,
        None if config.fields is None else list(config.fields),
        allow_pickle=config.allow_pickle,
        dims=manifest.dims,
        raw_bytes=config.raw_bytes,
        images=config.images,
    )


def dataset_collate(config: LoaderConfig, manifest: Manifest) -> Collate:
    """The collate function of ``config`` (the schema's optional fields passed on)."""
    return make_collate(config, [name for name, spec in manifest.schema.items() if spec.optional])


def dataset_planner(config: LoaderConfig) -> plan.Planner:
    """The plan of ``config``: packed rows, one source's samples, or a mix's (with each
    sample's source to count and tag)."""
    if config.packing is not None:
        return config.packing
    if config.mix is None:
        return plan.SinglePlanner(config.plan)
    return MixPlanner(config.mix, config.plan)


def loader_config(
    config: plan.PlanConfig,
    decoder: SampleDecoder | None,
    collate_fn: Collate | None,
    old: dict[str, Any],
) -> LoaderConfig:
    """The :class:`LoaderConfig` the earlier keywords describe (``config``: the plan's config),
    with a ``DeprecationWarning`` naming the new call. Missing or unknown keywords are a
    TypeError, as they were."""
    warnings.warn(
        "ShardStreamDataset(manifest=, split=, store=, config=PlanConfig, rank=, ...) is "
        f"deprecated and goes away in wdsloader {REMOVED_IN}: use "
        "ShardStreamDataset(config, manifest, store) with a wdsloader.stream.LoaderConfig "
        "(its plan= is the PlanConfig; create_loader resolves one)",
        DeprecationWarning,
        stacklevel=3,  # the code that made the dataset, above ShardStreamDataset.__init__
    )
    unknown = sorted(set(old) - set(_OLD_KEYWORDS))
    if unknown:
        raise TypeError(f"ShardStreamDataset() got unexpected keywords {unknown}")
    values = {k: old.get(k, default) for k, default in _OLD_KEYWORDS.items()}
    missing = [k for k, v in values.items() if v is _REQUIRED]
    missing += [k for k, v in (("decoder", decoder), ("collate_fn", collate_fn)) if v is None]
    if missing or decoder is None or collate_fn is None:
        raise TypeError(f"ShardStreamDataset() missing required keywords {missing}")
    return LoaderConfig(
        split=values["split"], rank=values["rank"], plan=config, epoch=0,
        fields=None if decoder.fields is None else tuple(decoder.fields),
        curriculum=values["curriculum"], collate=collate_fn, allow_pickle=decoder.allow_pickle,
        on_error=values["on_error"], max_skipped=values["max_skipped"], gather=values["gather"],
        readahead_batches=values["readahead_batches"], loader_kwargs={}, mix=values["mix"],
        raw_bytes=decoder.raw_bytes, images=decoder.images,
    )  # fmt: skip
