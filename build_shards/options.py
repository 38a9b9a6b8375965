"""The options of :func:`build_shards.build_shards`, grouped into frozen objects that check
themselves: :class:`ShardOptions` (the shards' layout), :class:`SampleOptions` (keys, split
fields, NaN), :class:`LockOptions` (the output's lock), :class:`RayEngine` (a build on a Ray
cluster) and :class:`LoaderDefaults` (what the manifest tells the loader), gathered with the
everyday keywords in one :class:`BuildOptions` (see :mod:`build_shards.resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from build_shards.commit.lock import DEFAULT_LOCK_TIMEOUT
from wdsloader.format import FieldSpec
from wdsloader.format.deflate import COMPRESSIONS

DEFAULT_SHARD_MAX_COUNT = 10_000
DEFAULT_SHARD_MAX_BYTES = 256 * 2**20


def _positive_int(owner: str, name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        what = "a positive int or None" if optional else "a positive int"
        where = f"{owner}.{name}" if owner else name
        raise ValueError(f"{where} must be {what}, got {value!r}")


def _bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def _name(owner: str, name: str, value: Any, optional: bool = True) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value:
        what = "a non-empty string or None" if optional else "a non-empty string"
        raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOptions:
    """How the samples are cut into shards; these options decide the shards' bytes.

    Each shard holds at most ``max_count`` samples and ``max_bytes`` file bytes (a bigger
    sample gets a shard of its own; with ``compression`` the bytes are judged before it). The
    source is cut into blocks of ``block_size`` consecutive items (None: at most 4 full shards,
    judged by the first sample's size, see :func:`build_shards.layout.params.default_block_size`),
    each writing ``{split}/{split}-BBBBB-PPP.tar``; the small last shards of the blocks are
    packed together at the end, so each split has at most one small shard.
    ``group_small_fields=True`` writes a sample's small scalar fields (ints, JSON scalars,
    strings of up to 512 bytes) as one member ``KEY.fields.json`` (see
    :mod:`wdsloader.format.groups`); ``compression="gzip"`` writes ``.tar.gz`` shards the loader
    still reads sample by sample (see :mod:`wdsloader.format.deflate`).
    """

    max_count: int = DEFAULT_SHARD_MAX_COUNT
    max_bytes: int = DEFAULT_SHARD_MAX_BYTES
    block_size: int | None = None
    compression: str | None = None
    group_small_fields: bool = False

    def __post_init__(self) -> None:
        _positive_int("ShardOptions", "max_count", self.max_count)
        _positive_int("ShardOptions", "max_bytes", self.max_bytes)
        _positive_int("ShardOptions", "block_size", self.block_size, optional=True)
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise ValueError(
                f"ShardOptions.compression must be None or one of {COMPRESSIONS}, "
                f"got {self.compression!r}"
            )
        _bool("ShardOptions", "group_small_fields", self.group_small_fields)


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleOptions:
    """How a source item becomes a sample: its key, its split field, its checks.

    The key is ``item[key_field]`` or the zero-padded source index. ``split_field`` names the
    field holding each sample's split (the field is not stored); ``group_by`` names the field
    whose value is hashed instead of the key when ``splits=`` fractions assign the splits (a
    group never straddles two splits). ``dims`` binds the symbolic dimensions of the schema (the
    first samples bind the others). NaN/Inf is a SchemaError unless ``allow_nan`` (then counted
    in ``manifest.build["nan_samples"]``). ``lengths`` names a field whose length (of an
    array's or list's first dimension, of a str or bytes) each shard records per sample beside
    its index (:mod:`wdsloader.format.lengths`; the field in ``manifest.build["lengths_field"]``),
    so that sequence packing and token counts are planned without reading samples.
    """

    key_field: str = "__key__"
    split_field: str | None = None
    group_by: str | None = None
    dims: Mapping[str, int] | None = None
    allow_nan: bool = False
    lengths: str | None = None

    def __post_init__(self) -> None:
        _name("SampleOptions", "key_field", self.key_field, optional=False)
        _name("SampleOptions", "lengths", self.lengths)
        _name("SampleOptions", "split_field", self.split_field)
        _name("SampleOptions", "group_by", self.group_by)
        if self.split_field is not None and self.group_by is not None:
            raise ValueError(
                f"SampleOptions(split_field={self.split_field!r}, group_by={self.group_by!r}): "
                "group_by groups the samples that splits= fractions assign, split_field names "
                "each sample's split; set one of them"
            )
        if self.dims is not None and not isinstance(self.dims, Mapping):
            raise ValueError(f"SampleOptions.dims must be a mapping or None, got {self.dims!r}")
        _bool("SampleOptions", "allow_nan", self.allow_nan)


@dataclass(frozen=True, slots=True, kw_only=True)
class LockOptions:
    """The output's lock: one build at a time per output (``OUTPUT/_build.lock``).

    A lock whose build is gone (a dead process of this host, or nothing finished for
    ``timeout`` seconds; None: never) is taken over; ``break_lock=True`` takes any lock.
    """

    timeout: float | None = DEFAULT_LOCK_TIMEOUT
    break_lock: bool = False

    def __post_init__(self) -> None:
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(
                f"LockOptions.timeout must be a positive number or None, got {timeout!r}"
            )
        _bool("LockOptions", "break_lock", self.break_lock)


@dataclass(frozen=True, slots=True, kw_only=True)
class RayEngine:
    """Build on a Ray cluster: one Ray task per block, each reading its block's range of the
    source and writing its shards straight to the output (which every node must reach, e.g.
    ``s3://``); the shards are byte-identical to the local engine's.

    ``address``: the cluster's (None: the Ray already initialised, the cluster ``ray.init()``
    finds, or a local one). Every source the local engine takes: the tasks read a ``datasets``
    Dataset/DatasetDict, a torch map-style Dataset, or JSONL and text files by range; the items
    of a list, generator or iterable dataset are read by the calling process in block order and
    sent to the object store a block at a time (``map`` runs in the tasks).
    ``engine="ray"`` is ``RayEngine()``.
    """

    address: str | None = None

    def __post_init__(self) -> None:
        _name("RayEngine", "address", self.address)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderDefaults:
    """What the manifest tells the loader (``manifest.loader_defaults``): ``collate``, the name
    of the default collator (e.g. ``"causal_lm"``); ``curriculum``, a
    :class:`wdsloader.Curriculum` or its dict, checked against the schema before anything is
    written; ``extra``, other entries kept as given (JSON values). ``defaults=`` also takes a
    mapping of these entries (see :meth:`of`).
    """

    collate: str | None = None
    curriculum: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _name("LoaderDefaults", "collate", self.collate)
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"LoaderDefaults.extra must be a mapping, got {self.extra!r}")
        for name in ("collate", "curriculum"):
            if name in self.extra:
                raise ValueError(
                    f"LoaderDefaults: {name!r} is a field of its own, not an entry of extra"
                )

    @classmethod
    def of(cls, defaults: LoaderDefaults | Mapping[str, Any] | None) -> LoaderDefaults:
        """``defaults`` as a LoaderDefaults (a mapping's ``collate`` and ``curriculum`` entries
        become those fields, the rest ``extra``)."""
        if defaults is None:
            return cls()
        if isinstance(defaults, LoaderDefaults):
            return defaults
        if not isinstance(defaults, Mapping):
            raise ValueError(f"defaults must be a LoaderDefaults or a mapping, got {defaults!r}")
        extra = {k: v for k, v in defaults.items() if k not in ("collate", "curriculum")}
        return cls(
            collate=defaults.get("collate"), curriculum=defaults.get("curriculum"), extra=extra
        )

    def entries(self) -> dict[str, Any]:
        """The entries as given (the curriculum not yet checked nor turned into its dict)."""
        out: dict[str, Any] = {} if self.collate is None else {"collate": self.collate}
        out.update(self.extra)
        if self.curriculum is not None:
            out["curriculum"] = self.curriculum
        return out


EngineSpec = str | RayEngine
"""``"local"`` (this process, or ``workers`` local processes), ``"ray"`` or a :class:`RayEngine`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """Everything a build is asked to do besides its source and output; made by
    :func:`build_shards.resolve.resolve_options` from :func:`build_shards.build_shards`' keywords."""

    splits: Mapping[str, float] | None = None
    map: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    schema: Mapping[str, FieldSpec | Mapping[str, Any]] | None = None
    workers: int = 1
    seed: int = 0
    overwrite: bool = False
    storage_options: dict[str, Any] | None = None
    progress: Any = False
    engine: EngineSpec = "local"
    shards: ShardOptions = field(default_factory=ShardOptions)
    samples: SampleOptions = field(default_factory=SampleOptions)
    lock: LockOptions = field(default_factory=LockOptions)
    defaults: LoaderDefaults = field(default_factory=LoaderDefaults)

    def __post_init__(self) -> None:
        _positive_int("", "workers", self.workers)
        for name, cls in (
            ("shards", ShardOptions),
            ("samples", SampleOptions),
            ("lock", LockOptions),
            ("defaults", LoaderDefaults),
        ):
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise TypeError(f"{name} must be a {cls.__name__}, got {value!r}")
