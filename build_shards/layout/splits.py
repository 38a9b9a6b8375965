"""Split assignment: a pure function of (key or group value, seed), a split field, or the source.

Fractions such as ``{"train": 0.8, "val": 0.1, "test": 0.1}`` are assigned by hashing: the first
8 bytes of ``blake2b(f"{seed}:{value}")`` as a number ``u`` in [0, 1), and the split is the first
whose cumulative fraction exceeds ``u``. ``value`` is the sample key, or the ``group_by`` field's
value so that a group never straddles two splits. Nothing but the value and the seed enters the
hash, so adding samples later never moves an existing sample to another split.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from build_shards.errors import BuildError
from wdsloader.errors import SchemaError

DEFAULT_SPLIT = "train"
_SPLIT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")
_TOLERANCE = 1e-6


def validate_split_name(name: Any) -> str:
    """``name`` if it can be a split (a folder name: letters, digits, '_' and '-')."""
    if not isinstance(name, str) or not _SPLIT_RE.match(name):
        raise ValueError(
            f"invalid split name {name!r}: use letters, digits, '_' and '-' (it names a folder)"
        )
    return name


def validate_fractions(splits: Mapping[str, float]) -> dict[str, float]:
    """The fractions as a dict, or ValueError unless they are positive and sum to 1 (±1e-6)."""
    if not isinstance(splits, Mapping) or not splits:
        raise ValueError(
            f"splits must be a non-empty mapping of split name to fraction: {splits!r}"
        )
    out: dict[str, float] = {}
    for name, frac in splits.items():
        validate_split_name(name)
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not frac > 0:
            raise ValueError(f"split {name!r}: fraction must be a positive number, got {frac!r}")
        out[name] = float(frac)
    total = sum(out.values())
    if abs(total - 1.0) > _TOLERANCE:
        raise ValueError(f"split fractions must sum to 1, got {total:.8g} for {out}")
    return out


def _canonical(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        raise TypeError(f"cannot hash a group value of type {type(value).__qualname__}") from None


def hash_unit(seed: int, value: Any) -> float:
    """A number in [0, 1) that depends only on ``seed`` and ``value`` (str or JSON-able)."""
    digest = hashlib.blake2b(f"{seed}:{_canonical(value)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Splitter:
    """Base: ``names`` are the splits known before the build (manifest order); calling it with
    ``(index, key, sample)`` returns the split and may remove a field from ``sample``."""

    names: tuple[str, ...] = ()

    def __call__(self, index: int, key: str, sample: dict[str, Any]) -> str:
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """JSON description for the manifest's build parameters."""
        raise NotImplementedError


class SingleSplit(Splitter):
    """Every sample in one split (default ``train``)."""

    def __init__(self, name: str = DEFAULT_SPLIT) -> None:
        self.names = (validate_split_name(name),)

    def __call__(self, index: int, key: str, sample: dict[str, Any]) -> str:
        return self.names[0]

    def spec(self) -> dict[str, Any]:
        return {"mode": "single", "split": self.names[0]}


class HashSplitter(Splitter):
    """Fractions assigned by a seeded hash of the key, or of the ``group_by`` field's value."""

    def __init__(self, fractions: Mapping[str, float], seed: int, group_by: str | None) -> None:
        self.fractions = validate_fractions(fractions)
        self.names = tuple(self.fractions)
        self.seed = int(seed)
        self.group_by = group_by
        bounds = np.cumsum(list(self.fractions.values()))
        self._bounds = [float(b) for b in bounds[:-1]]

    def assign(self, value: Any) -> str:
        """The split of a key or group value."""
        u = hash_unit(self.seed, value)
        for name, bound in zip(self.names, self._bounds, strict=False):
            if u < bound:
                return name
        return self.names[-1]

    def __call__(self, index: int, key: str, sample: dict[str, Any]) -> str:
        if self.group_by is None:
            return self.assign(key)
        try:
            value = sample[self.group_by]
        except KeyError:
            raise SchemaError(
                f"sample {key!r}: the group_by field {self.group_by!r} is missing"
            ) from None
        try:
            return self.assign(value)
        except TypeError as exc:
            raise SchemaError(f"sample {key!r}: field {self.group_by!r}: {exc}") from None

    def spec(self) -> dict[str, Any]:
        return {"mode": "hash", "fractions": self.fractions, "group_by": self.group_by}


class FieldSplitter(Splitter):
    """The split named by a field of each sample; the field itself is not stored."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, index: int, key: str, sample: dict[str, Any]) -> str:
        try:
            value = sample.pop(self.field)
        except KeyError:
            raise SchemaError(
                f"sample {key!r}: the split field {self.field!r} is missing"
            ) from None
        try:
            return validate_split_name(value)
        except ValueError as exc:
            raise SchemaError(f"sample {key!r}: field {self.field!r}: {exc}") from None

    def spec(self) -> dict[str, Any]:
        return {"mode": "field", "field": self.field}


class SourceSplitter(Splitter):
    """The splits of the source itself (a DatasetDict), looked up by source index."""

    def __init__(self, names: tuple[str, ...], starts: list[int]) -> None:
        self.names = tuple(validate_split_name(n) for n in names)
        self._starts = list(starts)

    def __call__(self, index: int, key: str, sample: dict[str, Any]) -> str:
        return self.names[bisect.bisect_right(self._starts, index) - 1]

    def spec(self) -> dict[str, Any]:
        return {"mode": "source", "splits": list(self.names)}


def make_splitter(
    source: Any,
    *,
    splits: Mapping[str, float] | None,
    split_field: str | None,
    group_by: str | None,
    seed: int,
) -> Splitter:
    """The splitter for the options, or a ValueError/BuildError when they conflict."""
    chosen = [n for n, v in (("splits", splits), ("split_field", split_field)) if v is not None]
    if source.fixed_splits is not None:
        chosen.append("a DatasetDict source")
    if len(chosen) > 1:
        raise BuildError(f"choose one way to assign splits, not {' and '.join(chosen)}")
    if group_by is not None and splits is None:
        raise BuildError("group_by needs splits={name: fraction, ...}")
    if splits is not None:
        return HashSplitter(splits, seed, group_by)
    if split_field is not None:
        return FieldSplitter(split_field)
    if source.fixed_splits is not None:
        return SourceSplitter(source.fixed_splits, source.split_starts)
    return SingleSplit()
