"""Curriculum fields: an epoch-dependent, per-sample choice among stored variants of a field.

A :class:`Curriculum` names the variants of one output field (for instance ``steering`` stored as
``steering_centroid.npy``, ``steering_keyword.npy``, ... plus a synthetic all-zeros variant) and a
:class:`~wdsloader.curriculum.Schedule` giving each variant's probability at each epoch. The variant
of a sample is a pure function of ``(seed, epoch, key)``: it does not depend on workers, ranks,
order, batching or resume. The schedules are re-exported here.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wdsloader.curriculum.probs import NAME_RE, ProbLike, check_epoch
from wdsloader.curriculum.schedule import (
    Schedule,
    fixed,
    from_callable,
    schedule_from_dict,
    zero_decay,
)
from wdsloader.errors import ManifestError
from wdsloader.format.checks import as_int
from wdsloader.format.manifest import FieldSpec

__all__ = ["Curriculum"]

log = logging.getLogger(__name__)

_CACHE_SIZE = 8
_HASH_PERSON = b"wdscurr1"
_U53 = 1.0 / (1 << 53)


class _Default(enum.Enum):
    """``index_output``'s default (distinct from None, which means no index field)."""

    INDEX = "<output>_variant"


_STEERING = ("steering", "steering_variant")  # the implicit names until wdsloader 0.2.0
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _warn_deprecated(message: str) -> None:
    """A DeprecationWarning attributed to the first frame outside the wdsloader package (the
    user's call, however deep in wdsloader the curriculum was made: ``from_dict``, a loader
    config), so Python's default filters show it."""
    frame, level = sys._getframe(1), 2  # level 2: this function's caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def _output_names(
    output: str | None, index_output: str | None | _Default
) -> tuple[str, str | None]:
    """``(output, index_output)`` with the defaults applied: ``<output>_variant`` for the index.
    Until wdsloader 0.2.0 (where ``output`` is required), a curriculum without ``output`` names
    its fields ``steering`` and ``steering_variant``, and one with another ``output`` but no
    ``index_output`` names its index ``steering_variant``, each with a DeprecationWarning."""
    if output is None:
        _warn_deprecated(
            "Curriculum without output=: the field is named 'steering' (index 'steering_variant')"
            " until wdsloader 0.2.0, where output= is required; pass output= (and index_output=)"
        )
        return _STEERING[0], _STEERING[1] if index_output is _Default.INDEX else index_output
    if index_output is not _Default.INDEX:
        return output, index_output
    if output != _STEERING[0]:
        _warn_deprecated(
            f"Curriculum(output={output!r}) without index_output=: the index field is named "
            f"'steering_variant' until wdsloader 0.2.0, then '{output}_variant'; pass "
            "index_output= (None: no index field)"
        )
        return output, _STEERING[1]
    return output, f"{output}_variant"


# -- the curriculum ---------------------------------------------------------------------------
def _shape_str(spec: FieldSpec) -> str:
    return f"{spec.encoding} {spec.dtype} {spec.shape}"


class Curriculum:
    """One output field whose value, per sample and epoch, is one of several stored variants.

    ``variants`` maps variant names, in declared order, to stored schema fields (``None`` for the
    synthetic zero variant: zeros with the others' shape and dtype). ``output`` names the produced
    field; ``index_output`` (unless None) an int64 field holding the variant's declared position
    (default: ``<output>_variant``). Until wdsloader 0.2.0, ``output`` may be left out (the
    fields are then ``steering`` and ``steering_variant``) and the index of another ``output`` is
    ``steering_variant`` by default, each with a DeprecationWarning.
    ``schedule`` gives the probabilities per epoch (default: :func:`zero_decay` when a variant is
    named ``"zero"``, else equal fixed probabilities). ``seed``, when set, is the seed the loader
    passes to :meth:`draw` in place of its own.
    """

    def __init__(
        self,
        variants: Mapping[str, str | None],
        *,
        output: str | None = None,
        index_output: str | None | _Default = _Default.INDEX,
        schedule: Schedule | Callable[[int], ProbLike] | None = None,
        seed: int | None = None,
    ) -> None:
        output, index_output = _output_names(output, index_output)
        if not isinstance(variants, Mapping):
            raise ValueError(
                f"curriculum variants: expected a mapping name -> field, got "
                f"{type(variants).__name__}"
            )
        if not variants:
            raise ValueError("curriculum variants: empty (need at least one variant)")
        names: list[str] = []
        by_field: dict[str | None, str] = {}
        for name, fld in variants.items():
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise ValueError(
                    f"curriculum variants: invalid variant name {name!r} (letters, digits, "
                    "'_', '.', '-')"
                )
            if fld is not None and (not isinstance(fld, str) or not fld):
                raise ValueError(
                    f"curriculum variant {name!r}: field must be a non-empty string or None "
                    f"(zero variant), got {fld!r}"
                )
            if fld in by_field:
                raise ValueError(
                    f"curriculum variants {by_field[fld]!r} and {name!r} both map to "
                    f"{'the zero variant (None)' if fld is None else repr(fld)}"
                )
            by_field[fld] = name
            names.append(name)
        if all(v is None for v in variants.values()):
            raise ValueError("curriculum variants: at least one variant must map to a stored field")
        if not isinstance(output, str) or not output:
            raise ValueError(f"curriculum output must be a non-empty string, got {output!r}")
        if index_output is not None:
            if not isinstance(index_output, str) or not index_output:
                raise ValueError(
                    f"curriculum index_output must be a non-empty string or None, got "
                    f"{index_output!r}"
                )
            if index_output == output:
                raise ValueError(f"curriculum index_output and output are both {output!r}")
            if index_output in by_field:
                raise ValueError(
                    f"curriculum index_output {index_output!r} is the field of variant "
                    f"{by_field[index_output]!r}"
                )
        if seed is not None:
            seed = as_int(seed, "curriculum seed")

        self.names: tuple[str, ...] = tuple(names)
        self._fields: tuple[str | None, ...] = tuple(variants[n] for n in names)
        self.fields: tuple[str, ...] = tuple(f for f in self._fields if f is not None)
        self.output: str = output
        self.index_output: str | None = index_output
        self.seed: int | None = seed
        if schedule is None:
            schedule = (
                zero_decay() if "zero" in self.names else fixed([1.0 / len(names)] * len(names))
            )
        elif not isinstance(schedule, Schedule):
            if not callable(schedule):
                raise ValueError(
                    f"curriculum schedule must be a Schedule, a function of the epoch or None, "
                    f"got {type(schedule).__name__}"
                )
            schedule = from_callable(schedule)
        self.schedule: Schedule = schedule
        self._cache: dict[int, np.ndarray] = {}
        for epoch in schedule.key_epochs():
            self._cdf(epoch)

    # -- names ---------------------------------------------------------------------------------
    def index(self, name: str) -> int:
        """The declared position of variant ``name``."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(
                f"unknown curriculum variant {name!r}; valid variants: {', '.join(self.names)}"
            ) from None

    def field_of(self, index: int) -> str | None:
        """The stored field of the variant at ``index`` (None for the zero variant)."""
        i = as_int(index, "variant index")
        if not 0 <= i < len(self.names):
            raise ValueError(f"variant index {i} out of range [0, {len(self.names)})")
        return self._fields[i]

    # -- probabilities and draws ---------------------------------------------------------------
    def probabilities(self, epoch: int) -> np.ndarray:
        """The variants' probabilities at ``epoch`` (float64, declared order)."""
        e = check_epoch(epoch)
        return self.schedule.probabilities(e, self.names)

    def _cdf(self, epoch: int) -> np.ndarray:
        cdf = self._cache.get(epoch)
        if cdf is None:
            p = self.probabilities(epoch)
            cdf = np.cumsum(p)
            positive = np.flatnonzero(p > 0)
            np.minimum(cdf, 1.0, out=cdf)
            cdf[positive[-1] :] = 1.0  # u < 1 always, so trailing zero variants are never chosen
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)), None)
            self._cache[epoch] = cdf
            log.debug(
                "curriculum %r epoch %d: %s",
                self.output,
                epoch,
                ", ".join(f"{n}={v:.4f}" for n, v in zip(self.names, p, strict=True)),
            )
        return cdf

    def draw(self, keys: Sequence[str], epoch: int, seed: int) -> np.ndarray:
        """The variant index (int64) of each sample key at ``epoch``, a pure function of
        ``(seed, epoch, key)``."""
        e = check_epoch(epoch)
        s = as_int(seed, "seed")
        cdf = self._cdf(e)
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        u = _uniforms(keys, e, s)
        return np.searchsorted(cdf, u, side="right").astype(np.int64, copy=False)

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description; :meth:`from_dict` inverts it (not for function schedules)."""
        return {
            "output": self.output,
            "index_output": self.index_output,
            "variants": dict(zip(self.names, self._fields, strict=True)),
            "schedule": self.schedule.to_dict(),
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curriculum:
        """The curriculum a :meth:`to_dict` result describes."""
        if not isinstance(data, Mapping):
            raise ValueError(f"curriculum dict: expected a mapping, got {type(data).__name__}")
        known = {"output", "index_output", "variants", "schedule", "seed"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"curriculum dict: unknown keys {unknown}; known: {sorted(known)}")
        if "variants" not in data:
            raise ValueError("curriculum dict: missing 'variants'")
        sched = data.get("schedule")
        return cls(
            data["variants"],
            output=data.get("output"),
            index_output=data.get("index_output", _Default.INDEX),
            schedule=None if sched is None else schedule_from_dict(sched),
            seed=data.get("seed"),
        )

    def __repr__(self) -> str:
        variants = ", ".join(f"{n}={f!r}" for n, f in zip(self.names, self._fields, strict=True))
        return (
            f"Curriculum({variants}; output={self.output!r}, index_output={self.index_output!r}, "
            f"schedule={self.schedule!r}, seed={self.seed!r})"
        )

    # -- schema --------------------------------------------------------------------------------
    def output_specs(
        self, schema: Mapping[str, FieldSpec], dims: Mapping[str, int] | None = None
    ) -> dict[str, FieldSpec]:
        """The schema entries of ``output`` (and ``index_output``), after checking that every stored
        variant is in ``schema`` and that all have the same npy encoding, dtype and shape."""
        stored = [(n, f) for n, f in zip(self.names, self._fields, strict=True) if f is not None]
        for name, fld in stored:
            if fld not in schema:
                raise ValueError(
                    f"curriculum variant {name!r}: field {fld!r} is not in the schema; schema "
                    f"fields: {', '.join(schema)}"
                )
        bound = dict(dims or {})

        def resolved(shape: list[Any] | None) -> list[Any] | None:
            if shape is None:
                return None
            return [bound.get(d, d) if isinstance(d, str) else d for d in shape]

        first_name, first_field = stored[0]
        first = schema[first_field]
        for name, fld in stored:
            spec = schema[fld]
            if spec.encoding != "npy" or spec.dtype is None or spec.shape is None:
                raise ValueError(
                    f"curriculum variant {name!r}: field {fld!r} must be an npy array with dtype "
                    f"and shape in the schema (the zero variant and collation need them), got "
                    f"{_shape_str(spec)}"
                )
        for name, fld in stored[1:]:
            spec = schema[fld]
            for attr in ("encoding", "dtype", "shape"):
                a, b = getattr(first, attr), getattr(spec, attr)
                if attr == "shape":
                    a, b = resolved(a), resolved(b)
                if a != b:
                    raise ValueError(
                        f"curriculum variants {first_name!r} ({first_field}: {_shape_str(first)}) "
                        f"and {name!r} ({fld}: {_shape_str(spec)}) differ in {attr}"
                    )
        if dims is not None and None in self._fields:
            unbound = [d for d in first.shape or [] if isinstance(d, str) and d not in bound]
            if unbound:
                raise ValueError(
                    f"curriculum {self.output!r}: the zero variant needs the shape of "
                    f"{first_field!r}, but dims {unbound} are not bound"
                )
        fields = set(self.fields)
        for label, out in (("output", self.output), ("index_output", self.index_output)):
            if out is not None and out in schema and out not in fields:
                raise ValueError(
                    f"curriculum {label} {out!r} collides with schema field {out!r}, which is not "
                    f"one of its variants ({', '.join(self.fields)})"
                )
        shape = list(first.shape or [])
        specs = {
            self.output: FieldSpec(ext=first.ext, encoding="npy", dtype=first.dtype, shape=shape)
        }
        if self.index_output is not None:
            specs[self.index_output] = FieldSpec(
                ext=f"{self.index_output}.cls",
                encoding="cls",
                dtype="int64",
                shape=[],
                range=[0, len(self.names) - 1],
            )
        return specs


def _uniforms(keys: Sequence[str], epoch: int, seed: int) -> np.ndarray:
    """One uniform in [0, 1) per key from an 8-byte keyed BLAKE2b of (seed, epoch, key)."""
    base = hashlib.blake2b(f"{seed}:{epoch}:".encode(), digest_size=8, person=_HASH_PERSON)
    copy = base.copy
    out: list[bytes] = []
    append = out.append
    try:
        for key in keys:
            h = copy()
            h.update(key.encode())
            append(h.digest())
    except AttributeError:
        bad = next(k for k in keys if not isinstance(k, str))
        raise ValueError(f"sample key {bad!r} is not a string") from None
    bits = np.frombuffer(b"".join(out), dtype="<u8")
    return (bits >> np.uint64(11)).astype(np.float64) * _U53


def stored_curriculum(loader_defaults: Mapping[str, Any], source: str) -> Curriculum | None:
    """The manifest's default curriculum (``loader_defaults["curriculum"]``), or None; one that
    does not build is a :class:`~wdsloader.errors.ManifestError` naming ``source`` (the
    manifest) and the field."""
    stored = loader_defaults.get("curriculum")
    if stored is None:
        return None
    try:
        return Curriculum.from_dict(stored)
    except ValueError as exc:
        raise ManifestError(f"{source}: loader_defaults.curriculum: {exc}") from None
