"""Inferring a build's schema from the first samples of its source, once, in the process that
starts the build (so every worker and engine encodes with the same schema, and the shards stay a
function of the data).

Up to :data:`~build_shards.encode.schema.INFER_ROWS` samples (after ``map``; fewer when they hold over
:data:`INFER_BYTES`, or past :data:`INFER_ITEMS` source items) are read; per field the specs of their values are merged:

- a field absent from some of them, or None in some (a field that is not JSON), is
  ``optional``: samples that lack it have no member for it, and the loader yields None;
- ints and floats in one field widen to a JSON float field (``dtype: float64``): every value,
  ints included, is written and read back as a float;
- arrays of one dtype and differing shapes give a field of varying shape (``shape: None``);
- ints of several dtypes (numpy scalars) give the int dtype that holds them all;
- any other difference (a str here, an int there) is a SchemaError naming both samples and
  saying how to declare the field.

A field that is None in every inferred sample stays a JSON field (``null``). Samples after
those are checked against the schema by the encoder.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from build_shards.encode.schema import (
    INFER_ROWS,
    declare_hint,
    finish_schema,
    infer_spec,
    is_pil,
    parse_name,
)
from build_shards.errors import BuildError
from build_shards.sources import Source
from build_shards.write.blocks import BlockJob, prepare
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, member_ext

INFER_BYTES = 64 * 2**20
"""Inference stops once the samples read hold about this many bytes (big samples)."""
INFER_ITEMS = 16 * INFER_ROWS
"""Inference stops after this many source items once it has a sample (a map that drops most
items)."""

Row = tuple[str, dict[str, Any]]


def first_rows(src: Source, job: BlockJob) -> tuple[Iterator[tuple[int, Any]] | None, list[Row]]:
    """The first samples ``map`` keeps (see the module doc), and for a sequential source the
    stream to build from (the items read so far put back in front)."""
    it = src.iter_range(0, src.length if src.indexable else None)
    seen: list[tuple[int, Any]] = []
    rows: list[Row] = []
    nbytes = 0
    for items, (index, raw) in enumerate(it, 1):
        if not src.indexable:
            seen.append((index, raw))
        prepared = prepare(job, index, raw)
        if prepared is None:
            if rows and items >= INFER_ITEMS:
                break
            continue
        key, _split, sample = prepared
        rows.append((key, sample))
        nbytes += sum(map(_approx_bytes, sample.values()))
        if len(rows) >= INFER_ROWS or nbytes >= INFER_BYTES:
            break
    if not rows:
        dropped = len(seen) if not src.indexable else src.length
        if dropped:
            raise BuildError(f"source is empty after map: it dropped all {dropped} items")
        raise BuildError("source is empty")
    stream = None if src.indexable else itertools.chain(seen, it)
    return stream, rows


def _approx_bytes(value: Any) -> int:
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if is_pil(value):
        return int(value.width * value.height * len(value.getbands()))
    nbytes = getattr(value, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else 16


def infer_schema(
    rows: list[Row],
    declared: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
) -> tuple[dict[str, FieldSpec], dict[str, int]]:
    """``(schema, dims)`` of the samples ``rows`` (see the module doc) with ``declared``
    fields (FieldSpec or dict) taking precedence."""
    seen: dict[str, _Seen] = {}
    named = {parse_name(name)[0] for name in declared or {}}
    for n, (key, sample) in enumerate(rows):
        here: set[str] = set()
        for name, value in sample.items():
            fname, explicit = parse_name(name)
            if fname in here:
                raise SchemaError(f"sample {key!r}: field {fname!r} appears twice ({name!r})")
            here.add(fname)
            got = seen.get(fname)
            if got is None:
                got = seen[fname] = _Seen(fname, explicit, fname in named, absent=n > 0)
            elif explicit != got.explicit:
                raise SchemaError(
                    f"sample {key!r}: field {fname!r}: named {name!r} here but stored as "
                    f".{got.explicit or got.spec_encoding()} in sample {got.key!r}"
                )
            got.add(key, value)
        for fname, got in seen.items():
            if fname not in here:
                got.absent = True
    inferred = {f: s.spec() for f, s in seen.items()}
    values = {f: (s.key, s.value) for f, s in seen.items() if s.merged is not None}
    return finish_schema(inferred, values, declared, dims)


@dataclass(slots=True)
class _Seen:
    """What the inferred samples hold in one field."""

    name: str
    explicit: str | None
    declared: bool  # the caller declares the field: its values are checked by the encoder
    absent: bool = False  # some sample lacks the field
    nulls: bool = False  # some sample holds None
    merged: FieldSpec | None = None  # the spec of the values that are not None
    key: str = ""  # the sample of the first such value
    value: Any = None
    kinds: set[str] = field(default_factory=set)  # "int", "float", "other" (JSON)

    def add(self, key: str, value: Any) -> None:
        if value is None:
            self.nulls = True
            return
        spec = infer_spec(key, self.name, self.explicit, value)
        self.kinds.add(_kind(spec, value))
        if self.merged is None:
            self.merged, self.key, self.value = spec, key, value
            return
        if spec == self.merged or self.declared:
            return
        have = self.merged
        if spec.encoding == have.encoding == "npy" and spec.dtype == have.dtype:
            self.merged = dataclasses.replace(have, shape=None)  # arrays of varying shape
            return
        if spec.encoding == have.encoding == "cls":  # ints of several dtypes: one that holds all
            self.merged = dataclasses.replace(have, dtype=_wider_int(have.dtype, spec.dtype))
            return
        if self.kinds <= {"int", "float"} and {spec.encoding, have.encoding} <= {"cls", "json"}:
            return  # ints and floats: widened to float in spec()
        arrays = spec.encoding == have.encoding == "npy"  # of two dtypes: any dtype is kept
        raise SchemaError(
            f"sample {key!r}: field {self.name!r}: {_describe(spec, value)} here but "
            f"{_describe(have, self.value)} in sample {self.key!r}"
            + declare_hint(self.name, **({"dtype": None} if arrays else {"encoding": "json"}))
        )

    def spec_encoding(self) -> str:
        return "?" if self.merged is None else self.merged.encoding

    def spec(self) -> FieldSpec:
        """The merged spec of the field."""
        if self.merged is None:  # None in every sample: a JSON null
            return FieldSpec(ext=member_ext(self.name, "json"), encoding="json", dtype="json")
        spec = self.merged
        if self.kinds == {"float"} or self.kinds == {"int", "float"}:
            spec = FieldSpec(ext=member_ext(self.name, "json"), encoding="json", dtype="float64")
        # a JSON field stores None as null; only an absent key makes it optional
        optional = self.absent or (self.nulls and spec.encoding != "json")
        return dataclasses.replace(spec, optional=True) if optional else spec


def _wider_int(a: str | None, b: str | None) -> str:
    """The int dtype that holds the ints of ``a`` and of ``b`` (``int``, a Python int, is int64
    and stays ``int``; int64 where none does: uint64 with a signed dtype)."""
    wide = np.promote_types(*(np.dtype("int64" if d in (None, "int") else d) for d in (a, b)))
    name = wide.name if wide.kind in "iu" else "int64"
    return "int" if name == "int64" and "int" in (a, b) else name


def _kind(spec: FieldSpec, value: Any) -> str:
    """``int`` (a cls int), ``float`` (a JSON float) or ``other``."""
    if spec.encoding == "cls":
        return "int"
    if spec.encoding == "json" and isinstance(value, (float, np.floating)):
        return "float"
    return "other"


def _describe(spec: FieldSpec, value: Any) -> str:
    name = type(value).__name__
    if spec.encoding == "npy":
        name += f" of {spec.dtype}"
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name} (.{spec.encoding})"
