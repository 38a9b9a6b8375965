"""Step accounting as in Dream Trainer: epoch length, global batch, accumulation, val steps.

Works on plain torch loaders and on :func:`wdsloader.create_loader`'s, whose per-rank batch size
lives in its plan (``loader.batch_size`` is None there: the workers collate the batches).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = [
    "Batch",
    "get_epoch_length",
    "get_train_dataloader_steps",
    "get_val_dataloader_steps",
    "loader_batch_size",
]

log = logging.getLogger(__name__)

Batch = dict[str, Any]
"""A batch: field name -> tensor (or list)."""


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def get_epoch_length(loader: Any, length: int | None = None, *, stage: str = "train") -> int:
    """Batches per epoch: ``length`` when given, else ``len(loader)``.

    A loader without ``__len__`` (an iterable dataset) is a ValueError asking for
    ``{stage}_steps_per_epoch``; a loader of 0 batches is a ValueError too.
    """
    if length is not None:
        return _positive(f"{stage}_steps_per_epoch", length)
    try:
        n = len(loader)
    except TypeError:
        raise ValueError(
            f"the dataset of {type(loader).__name__} has no __len__ (an iterable dataset): "
            f"pass the steps per epoch ({stage}_steps_per_epoch=...)"
        ) from None
    if n < 1:
        raise ValueError(f"{type(loader).__name__} yields no batch in an epoch (len 0)")
    return n


def loader_batch_size(loader: Any) -> int:
    """The per-rank batch size of ``loader``: our loader's plan, else ``loader.batch_size``, its
    batch sampler's, or its dataset's ``batch_size``; a ValueError when none says."""
    dataset_obj = getattr(loader, "dataset_obj", None)
    plan = getattr(dataset_obj, "config", None)
    candidates = (
        getattr(plan, "batch_size", None),
        getattr(loader, "batch_size", None),
        getattr(getattr(loader, "batch_sampler", None), "batch_size", None),
        getattr(getattr(loader, "dataset", None), "batch_size", None),
    )
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ValueError(
        f"cannot tell the batch size of {type(loader).__name__}: neither the loader, its "
        f"batch sampler nor its dataset has an integer batch_size"
    )


def get_train_dataloader_steps(
    loader: Any,
    train_steps_per_epoch: int | None = None,
    train_batch_size: int | None = None,
    dp_size: int = 1,
) -> tuple[int, int, int]:
    """``(train_batch_size, num_train_steps, grad_accum)``, as Dream Trainer computes them.

    The effective batch of one loader step is the per-rank batch size times ``dp_size``;
    ``train_batch_size`` (the global batch of one optimizer step; default: that effective
    batch) must be a multiple of it, and ``grad_accum = train_batch_size // effective``.
    ``num_train_steps`` counts loader batches: ``len(loader)``, or ``train_steps_per_epoch``
    (which counts optimizer steps) times ``grad_accum``; more than the loader holds is logged
    as a warning.
    """
    dp_size = _positive("dp_size", dp_size)
    effective = loader_batch_size(loader) * dp_size
    if train_batch_size is None:
        train_batch_size = effective
    _positive("train_batch_size", train_batch_size)
    if effective > train_batch_size:
        raise ValueError(
            f"train_batch_size={train_batch_size} is smaller than one step of the loader: batch "
            f"size {effective // dp_size} x dp_size {dp_size} = {effective}"
        )
    if train_batch_size % effective:
        raise ValueError(
            f"train_batch_size={train_batch_size} is not a multiple of the loader's batch size "
            f"{effective // dp_size} x dp_size {dp_size} = {effective}"
        )
    grad_accum = train_batch_size // effective
    steps = get_epoch_length(loader, train_steps_per_epoch, stage="train")
    if train_steps_per_epoch is not None:
        steps *= grad_accum
        _warn_if_longer(loader, steps, "train_steps_per_epoch x grad_accum")
    return train_batch_size, steps, grad_accum


def get_val_dataloader_steps(
    loader: Any,
    val_steps_per_epoch: int | None = None,
    num_sanity_val_steps: int = 0,
    dp_size: int = 1,
) -> tuple[int, int]:
    """``(num_val_steps, num_sanity_val_steps)``, as in Dream Trainer: the validation batches
    per epoch (``val_steps_per_epoch`` or ``len(loader)``) and the sanity steps, each divided by
    ``dp_size`` (floor). Pass ``dp_size=1`` for a loader whose length is already per rank
    (ours, or one with a ``DistributedSampler``)."""
    dp_size = _positive("dp_size", dp_size)
    if not isinstance(num_sanity_val_steps, int) or num_sanity_val_steps < 0:
        raise ValueError(f"num_sanity_val_steps must be >= 0, got {num_sanity_val_steps!r}")
    steps = get_epoch_length(loader, val_steps_per_epoch, stage="val")
    if val_steps_per_epoch is not None:
        _warn_if_longer(loader, steps, "val_steps_per_epoch")
    return steps // dp_size, num_sanity_val_steps // dp_size


def _warn_if_longer(loader: Any, steps: int, what: str) -> None:
    try:
        n = len(loader)
    except TypeError:
        return
    if steps > n:
        log.warning("%s = %d is more than the %d batches of the loader", what, steps, n)
