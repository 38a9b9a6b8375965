"""The one way from :func:`build_shards.build_shards`' keywords to a :class:`BuildOptions`: the
everyday keywords and the option objects as given, the loose keywords of 0.1 applied to the
option objects by one table (:data:`DEPRECATED`), each with a DeprecationWarning."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from build_shards.options import (
    BuildOptions,
    LoaderDefaults,
    LockOptions,
    RayEngine,
    SampleOptions,
    ShardOptions,
)

REMOVED_IN = "0.2.0"

OBJECTS: dict[str, type] = {
    "shards": ShardOptions,
    "samples": SampleOptions,
    "lock": LockOptions,
    "engine": RayEngine,
    "defaults": LoaderDefaults,
}
"""The keyword of each option object, and its class."""

DEPRECATED: dict[str, tuple[str, str | None]] = {
    "shard_max_count": ("shards", "max_count"),
    "shard_max_bytes": ("shards", "max_bytes"),
    "block_size": ("shards", "block_size"),
    "compression": ("shards", "compression"),
    "group_small_fields": ("shards", "group_small_fields"),
    "key_field": ("samples", "key_field"),
    "split_field": ("samples", "split_field"),
    "group_by": ("samples", "group_by"),
    "dims": ("samples", "dims"),
    "allow_nan": ("samples", "allow_nan"),
    "lock_timeout": ("lock", "timeout"),
    "break_lock": ("lock", "break_lock"),
    "ray_address": ("engine", "address"),
    "loader_defaults": ("defaults", None),  # None: the whole object (a mapping)
    "curriculum": ("defaults", "curriculum"),
}
"""A deprecated keyword -> (the option object's keyword, its field)."""


KEYWORDS = frozenset(f.name for f in dataclasses.fields(BuildOptions))
"""The keywords of :func:`build_shards.build_shards` besides its source and output."""


def resolve_options(
    kwargs: Mapping[str, Any], *, caller: str = "build_shards", stacklevel: int = 3
) -> BuildOptions:
    """The options of a call from its keywords: those of :data:`KEYWORDS` as given (None for
    an option object: its defaults; ``defaults`` may be a mapping) and the deprecated ones of
    :data:`DEPRECATED`. An unknown keyword is a TypeError, a deprecated one a
    DeprecationWarning naming its replacement (``stacklevel`` 3: at the caller's caller), and
    one that disagrees with the option object's field a ValueError naming both."""
    unknown = [name for name in kwargs if name not in KEYWORDS and name not in DEPRECATED]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    values = {k: v for k, v in kwargs.items() if k in KEYWORDS and v is not None}
    values["defaults"] = LoaderDefaults.of(kwargs.get("defaults"))
    deprecated = {k: v for k, v in kwargs.items() if k in DEPRECATED}
    changes: dict[str, dict[str | None, tuple[str, Any]]] = {}
    for old, value in deprecated.items():
        target, name = DEPRECATED[old]
        warnings.warn(_deprecation(caller, old), DeprecationWarning, stacklevel=stacklevel)
        changes.setdefault(target, {})[name] = (old, value)
    for target, fields in changes.items():
        if target == "engine":
            current = _ray_engine(values.get("engine", "local"))
        else:
            current = values.get(target) or OBJECTS[target]()
        values[target] = _apply(caller, target, current, fields)
    return BuildOptions(**values)


def _deprecation(caller: str, old: str) -> str:
    target, name = DEPRECATED[old]
    if name is None:
        replacement = f"{target}={{...}} (a mapping or {OBJECTS[target].__name__})"
    else:
        replacement = f"{target}={OBJECTS[target].__name__}({name}=...)"
    return f"{caller}({old}=...) is deprecated: pass {replacement}; removed in {REMOVED_IN}"


def _ray_engine(engine: Any) -> Any:
    """``engine`` as the object ``ray_address`` applies to (``"local"``: a ValueError; another
    name is left to :func:`build_shards.engines.make_engine` to refuse)."""
    if engine == "local":
        raise ValueError(
            "ray_address is an option of engine='ray': pass engine=RayEngine(address=...)"
        )
    return RayEngine() if engine == "ray" else engine


def _apply(caller: str, target: str, obj: Any, fields: Mapping[str | None, tuple[str, Any]]) -> Any:
    """``obj`` with the deprecated keywords' values (``fields``: field -> (keyword, value));
    a field that ``obj`` sets to another value is a ValueError naming both."""
    if not isinstance(obj, OBJECTS[target]):
        return obj  # not an option object: its own check refuses it
    if None in fields:  # the whole object (loader_defaults=)
        old, value = fields[None]
        whole = LoaderDefaults.of(value)
        if obj != LoaderDefaults() and obj != whole:
            raise ValueError(
                f"{caller}({old}=...) and {target}= disagree: pass {target}= only "
                f"({old} is deprecated)"
            )
        obj = whole
    default = type(obj)()
    updates: dict[str, Any] = {}
    for name, (old, value) in fields.items():
        if name is None:
            continue
        current = getattr(obj, name)
        if current != getattr(default, name) and current != value:
            cls = type(obj).__name__
            raise ValueError(
                f"{caller}({old}={value!r}) disagrees with {target}={cls}({name}={current!r}): "
                f"pass {target}= only ({old} is deprecated)"
            )
        updates[name] = value
    return dataclasses.replace(obj, **updates)
