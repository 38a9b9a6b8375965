"""The batching seam of the mix plan: what a strategy is (:class:`BatchingStrategy`), the
topology it deals an epoch over (:class:`MixTopology`) and the registry of strategies by name
(:func:`register_batching_strategy`, :func:`get_batching_strategy`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from wdsloader.format.checks import as_int
from wdsloader.plan.mix_stream import MixEpoch
from wdsloader.plan.resume import Resume

__all__ = [
    "BUILTIN_BATCHINGS",
    "TOPOLOGY",
    "BatchingStrategy",
    "MixBatchIds",
    "MixTopology",
    "batching_strategies",
    "get_batching_strategy",
    "register_batching_strategy",
    "same_topology_done",
    "unregister_batching_strategy",
]

#: One mixed batch: the source and the sample id (in that source) of each of its samples.
MixBatchIds = tuple[np.ndarray, np.ndarray]

#: The strategies that ship with wdsloader (they cannot be replaced nor unregistered).
BUILTIN_BATCHINGS = ("mixed", "stratified")

#: The fields of a topology; a resume on other values of them is an elastic resume.
TOPOLOGY = ("batch_size", "world_size", "num_workers", "drop_last", "window")


@runtime_checkable
class BatchingStrategy(Protocol):
    """How a mix deals one epoch's samples (a :class:`~wdsloader.plan.mix.MixEpoch`: each
    source's quota) into the batches of every rank and worker of a :class:`MixTopology`.

    Every rank yields :meth:`num_batches` batches; over the ranks and workers the epoch's
    samples come once each, but for the :meth:`dropped` ones (``drop_last=True``) and the
    :meth:`padding` ones that come twice (``drop_last=False``). The same inputs give the same
    batches in every process (no I/O, no global random state). A ``resume`` is a plan
    :class:`~wdsloader.plan.Resume` chain whose configs give the topology of each earlier run;
    an ``elastic`` strategy continues on another topology, the others raise ValueError there.
    """

    @property
    def name(self) -> str:
        """The name ``batching=`` selects it by (lower-case letters, digits and '_')."""
        ...

    @property
    def elastic(self) -> bool:
        """Whether a resume may change the topology (world size, workers, batch size...)."""
        ...

    def num_batches(self, me: MixEpoch, topo: MixTopology, resume: Resume | None) -> int:
        """Batches every rank yields in the epoch (from ``resume`` on)."""
        ...

    def padding(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples delivered twice in the epoch so every rank gets its batches."""
        ...

    def dropped(self, me: MixEpoch, topo: MixTopology) -> int:
        """Samples of the epoch's quotas left out so every batch is full."""
        ...

    def worker_batches(
        self, me: MixEpoch, topo: MixTopology, rank: int, worker: int, resume: Resume | None
    ) -> Sequence[MixBatchIds]:
        """The batches worker ``worker`` of ``rank`` yields (from ``resume`` on): the rank's
        batches ``worker, worker + num_workers, ...`` (torch's round robin over workers),
        computed when indexed."""
        ...


_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_REGISTRY: dict[str, BatchingStrategy] = {}


def batching_strategies() -> tuple[str, ...]:
    """The registered strategies' names, the built-in ones first."""
    return tuple(_REGISTRY)


def get_batching_strategy(name: str) -> BatchingStrategy:
    """The strategy registered as ``name``; a ValueError listing the registered ones if none."""
    strategy = _REGISTRY.get(name) if isinstance(name, str) else None
    if strategy is None:
        raise ValueError(f"batching must be one of {batching_strategies()}, got {name!r}")
    return strategy


def register_batching_strategy(strategy: BatchingStrategy, *, replace: bool = False) -> None:
    """Make ``strategy`` the mix's ``batching=strategy.name`` (e.g.
    ``create_loader(Mix(sources, batching=name), ...)``).

    The name enters the loader state's fingerprint, so a state saved under one strategy does
    not load under another; for that reason a built-in name cannot be replaced. Another name
    already registered is a ValueError unless ``replace=True`` (a loader already made keeps the
    strategy it was made with). The strategy reaches spawned workers inside the loader, so it
    must pickle (an instance of a module-level class does).
    """
    if not isinstance(strategy, BatchingStrategy):
        raise TypeError(
            "a batching strategy needs name, elastic, num_batches, padding, dropped and "
            "worker_batches (wdsloader.plan.batching.BatchingStrategy, or subclass "
            f"GlobalBatching); got {strategy!r}"
        )
    name = strategy.name
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"batching strategy name {name!r} must be lower-case letters, digits and '_'"
        )
    if name in BUILTIN_BATCHINGS and name in _REGISTRY:
        raise ValueError(f"batching {name!r} is built in and cannot be replaced")
    if name in _REGISTRY and not replace:
        raise ValueError(
            f"a batching strategy named {name!r} is already registered; pass replace=True to "
            "override it"
        )
    _REGISTRY[name] = strategy


def unregister_batching_strategy(name: str) -> None:
    """Undo :func:`register_batching_strategy` (a built-in name is a ValueError)."""
    if name in BUILTIN_BATCHINGS:
        raise ValueError(f"batching {name!r} is built in and cannot be unregistered")
    _REGISTRY.pop(name, None)


def _either(names: Sequence[str]) -> str:
    """``'a', 'b' or 'c'``."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MixTopology:
    """How the epoch is dealt: ``batch_size`` per rank, ``world_size`` ranks, ``num_workers``
    plan workers per rank (at least 1), ``drop_last``, the per-worker shuffle ``window``
    (samples; ``batching="mixed"`` only) and ``batching``: a registered strategy's name
    (:func:`batching_strategies`), resolved once into :attr:`strategy` (which travels with the
    topology into workers)."""

    batch_size: int
    world_size: int = 1
    num_workers: int = 1
    drop_last: bool = True
    window: int = 0
    batching: str = "mixed"
    strategy: BatchingStrategy = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("batch_size", "world_size", "num_workers"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, 1))
        object.__setattr__(self, "window", as_int(self.window, "window", 0))
        strategy = _REGISTRY.get(self.batching) if isinstance(self.batching, str) else None
        if strategy is None:
            raise ValueError(
                f"batching must be {_either(batching_strategies())}, got {self.batching!r}"
            )
        object.__setattr__(self, "strategy", strategy)


def same_topology_done(topo: MixTopology, resume: Resume | None) -> int:
    """Batches done under ``resume`` for a strategy that is not elastic: ``resume`` must be
    one run on ``topo`` (a ValueError naming the elastic strategies otherwise)."""
    if resume is None:
        return 0
    same = all(getattr(resume.config, k) == getattr(topo, k) for k in TOPOLOGY)
    if resume.prior is not None or not same:
        elastic = " or ".join(f'batching="{n}"' for n, s in _REGISTRY.items() if s.elastic)
        raise ValueError(
            f'batching="{topo.batching}" resumes only on the topology it was saved with '
            "(world_size, num_workers, batch_size, drop_last, window); "
            f"use {elastic} for elastic resume"
        )
    return resume.batches_done
