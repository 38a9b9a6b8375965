"""``LoaderOptions``: everything :func:`~wdsloader.create_loader` was given, as one frozen
record of option objects; and the keywords of wdsloader 0.1 that moved into those objects.

A moved keyword still works until wdsloader 0.2.0 with a ``DeprecationWarning`` naming its
replacement (:data:`DEPRECATED` maps each onto the object and field that replace it); given
together with that field of the object set to another value, it is a ValueError.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wdsloader.io.options import ReadOptions
from wdsloader.mix.options import Mix
from wdsloader.mix.source import MixSource
from wdsloader.plan.packing import Packing
from wdsloader.redact import redact_options
from wdsloader.stream.config import CollateSpec
from wdsloader.stream.options import (
    DecodeOptions,
    ErrorPolicy,
    PlanOptions,
    Topology,
    WorkerOptions,
)

__all__ = ["DEPRECATED", "LoaderOptions", "loader_options"]

REMOVED_IN = "0.2.0"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderOptions:
    """One loader's options (see :func:`~wdsloader.create_loader` for each): the split and
    batching, then one option object per concern; ``mix`` is the mix of datasets read (None:
    one dataset); ``packing`` packs documents into rows (None: batches of samples). A ``collate_options`` with a callable ``collate_fn``, a batch size below 1
    or a negative worker count are a ValueError, as is a worker option without workers."""

    split: str
    batch_size: int
    num_workers: int = 0
    distributed: bool = False
    epoch: int = 0
    drop_last: bool | None = None
    pin_memory: bool = True
    shuffle: bool | None = None
    seed: int = 0
    collate_fn: CollateSpec | None = None
    plan: PlanOptions = dataclasses.field(default_factory=PlanOptions)
    topology: Topology = dataclasses.field(default_factory=Topology)
    workers: WorkerOptions = dataclasses.field(default_factory=WorkerOptions)
    read_options: ReadOptions = dataclasses.field(default_factory=ReadOptions)
    decode: DecodeOptions = dataclasses.field(default_factory=DecodeOptions)
    errors: ErrorPolicy = dataclasses.field(default_factory=ErrorPolicy)
    mix: Mix | None = None
    packing: Packing | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        for name, cls in _OBJECTS.items():
            value = getattr(self, name)
            if not isinstance(value, cls) and (value is not None or name != "mix"):
                raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
        if self.packing is not None and not isinstance(self.packing, Packing):
            raise TypeError(f"packing must be a Packing, got {type(self.packing).__name__}")
        if self.packing is not None and self.mix is not None:
            raise ValueError(
                "packing= reads one dataset: packing a Mix of sources is not supported"
            )
        self.workers.check(self.num_workers)
        collate_options = self.decode.collate_options
        if collate_options and callable(self.collate_fn):
            raise ValueError(
                f"collate_options={sorted(collate_options)} would be unused: collate_fn is a "
                "callable (they configure a registered collator given by name)"
            )


_OBJECTS: dict[str, type[Any]] = {
    "plan": PlanOptions,
    "topology": Topology,
    "workers": WorkerOptions,
    "read_options": ReadOptions,
    "decode": DecodeOptions,
    "errors": ErrorPolicy,
    "mix": Mix,
}

# create_loader's keywords of wdsloader 0.1 -> (the option it moved into, its field there)
DEPRECATED: dict[str, tuple[str, str]] = {
    "span": ("plan", "span"),
    "shuffle_window": ("plan", "shuffle_window"),
    "rank": ("topology", "rank"),
    "world_size": ("topology", "world_size"),
    "device_mesh": ("topology", "device_mesh"),
    "dp_dim": ("topology", "dp_dim"),
    "persistent_workers": ("workers", "persistent_workers"),
    "prefetch_factor": ("workers", "prefetch_factor"),
    "multiprocessing_context": ("workers", "multiprocessing_context"),
    "cache_dir": ("read_options", "cache_dir"),
    "cache_limit_bytes": ("read_options", "cache_limit_bytes"),
    "verify_checksum": ("read_options", "verify_checksum"),
    "fields": ("decode", "fields"),
    "curriculum": ("decode", "curriculum"),
    "collate_options": ("decode", "collate_options"),
    "gather": ("decode", "gather"),
    "allow_pickle": ("decode", "allow_pickle"),
    "on_error": ("errors", "on_error"),
    "max_skipped": ("errors", "max_skipped"),
    "check_shards": ("errors", "check_shards"),
    "weights": ("mix", "weights"),
    "epoch_samples": ("mix", "epoch_samples"),
    "batching": ("mix", "batching"),
    "source_field": ("mix", "source_field"),
}

_PARAMETER = {"mix": "source"}  # the create_loader parameter an option object is passed as
Changes = dict[str, tuple[str, Any]]  # field -> (the keyword that sets it, its value)


def deprecation_message(old: str) -> str:
    """What the ``DeprecationWarning`` of ``create_loader(old=...)`` says."""
    where, field = DEPRECATED[old]
    if where == "mix":
        new = f"source=Mix(sources, {field}=...)"
    else:
        new = f"{where}={_OBJECTS[where].__name__}({field}=...)"
    return (
        f"create_loader({old}=...) is deprecated: pass {new}; "
        f"it will be removed in wdsloader {REMOVED_IN}"
    )


def loader_options(
    source: str | os.PathLike[str] | Mix | Sequence[MixSource],
    deprecated: Mapping[str, Any],
    *,
    storage_options: dict[str, Any] | None = None,
    **given: Any,
) -> tuple[str | None, LoaderOptions]:
    """The dataset root (None for a mix) and the :class:`LoaderOptions` of a
    ``create_loader`` call: ``given`` are its parameters (option objects None for their
    defaults), ``deprecated`` its moved keywords (each warned about, then set on its object),
    ``storage_options`` set on ``read_options``. An unknown keyword is a TypeError."""
    unknown = [name for name in deprecated if name not in DEPRECATED]
    if unknown:
        raise TypeError(f"create_loader() got an unexpected keyword argument {unknown[0]!r}")
    moved: dict[str, Changes] = {}
    for old, value in deprecated.items():
        warnings.warn(deprecation_message(old), DeprecationWarning, stacklevel=3)
        where, field = DEPRECATED[old]
        if value is not None:  # None was each keyword's "not given"
            moved.setdefault(where, {})[field] = (old, value)
    if storage_options is not None:
        moved.setdefault("read_options", {})["storage_options"] = (
            "storage_options",
            storage_options,
        )
    root, mix = _source(source, moved.pop("mix", {}))
    for name in _OBJECTS:
        if name != "mix":
            given[name] = _merged(name, given.get(name), moved.get(name, {}))
    return root, LoaderOptions(**given, mix=mix)


def _source(
    source: str | os.PathLike[str] | Mix | Sequence[MixSource], changes: Changes
) -> tuple[str | None, Mix | None]:
    if isinstance(source, str | os.PathLike):
        if changes:
            unused = sorted(old for old, _ in changes.values())
            raise ValueError(
                f"{unused} would be unused: they configure a mix (pass a Mix as the source)"
            )
        return os.fspath(source), None
    mix = source if isinstance(source, Mix) else Mix(list(source))
    return None, _merged("mix", mix, changes)


def _merged(name: str, value: Any, changes: Changes) -> Any:
    """The option object ``value`` (None: its defaults) with ``changes`` applied; a change to
    a field the object sets to another value is a ValueError."""
    cls = _OBJECTS[name]
    base: Any = cls() if value is None else value
    if not changes or not isinstance(base, cls):
        return base  # a wrong type is LoaderOptions' TypeError
    defaults = {f.name: f.default for f in dataclasses.fields(base)}
    for field, (old, new) in changes.items():
        current = getattr(base, field)
        if current != defaults[field] and not _same(current, new):
            raise ValueError(
                f"{old}={_shown(field, new)!r} conflicts with "
                f"{_PARAMETER.get(name, name)}.{field}={_shown(field, current)!r}; "
                "give it in one place"
            )
    return dataclasses.replace(base, **{field: new for field, (_, new) in changes.items()})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, Sequence) and not isinstance(b, str):
        return a == tuple(b)
    return bool(a == b)


def _shown(field: str, value: Any) -> Any:
    return redact_options(value) if field == "storage_options" else value
