"""The schema checks a decoded value goes through: an ``npy`` array's dtype and shape, a ``cls``
int cast to the declared dtype, and the picklable wrappers that chain a decoder with its check
(classes, not closures: decoders travel to ``spawn``/``forkserver`` workers by pickle)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from wdsloader.decode.codecs import Decoder
from wdsloader.format.manifest import FieldSpec


class SchemaMismatch(ValueError):
    """A decoded value does not match its FieldSpec."""


class _NpyCheck:
    """Post-decode check of an ``npy`` field against the schema's dtype and shape (literal
    sizes and symbolic dims bound in the manifest's ``dims``; an unbound dim takes any size).

    A small class rather than a closure: the decoder travels to ``spawn``/``forkserver``
    workers by pickle.
    """

    __slots__ = ("declared", "dtype", "shape")

    def __init__(
        self,
        dtype: np.dtype,
        shape: tuple[int | None, ...],
        declared: tuple[int | str, ...] | None = None,
    ) -> None:
        self.dtype = dtype
        self.shape = shape
        self.declared = declared if declared is not None else shape

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            raise SchemaMismatch(f"expected an array, got {type(value).__name__}")
        if value.dtype != self.dtype:
            raise SchemaMismatch(f"dtype {value.dtype}, schema says {self.dtype}")
        if value.ndim != len(self.shape) or any(
            want is not None and want != got
            for want, got in zip(self.shape, value.shape, strict=False)
        ):
            raise SchemaMismatch(f"shape {list(value.shape)}, schema says {self._says()}")
        return value

    def _says(self) -> str:
        bound = [
            (d, n) for d, n in zip(self.declared, self.shape, strict=True) if isinstance(d, str)
        ]
        if not bound:
            return str(list(self.shape))
        sizes = ", ".join(f"{d}={n}" for d, n in bound if n is not None)
        return f"{list(self.declared)} with {sizes} (the manifest's dims)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NpyCheck) and (self.dtype, self.shape, self.declared) == (
            other.dtype,
            other.shape,
            other.declared,
        )

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape, self.declared))

    def __repr__(self) -> str:
        return f"_NpyCheck({self.dtype}, {list(self.declared)})"


def npy_check(spec: FieldSpec, dims: Mapping[str, int]) -> _NpyCheck | None:
    """A post-decode check of dtype and shape for an ``npy`` field with a declared dtype and
    shape, its symbolic dims bound by ``dims``."""
    if spec.dtype is None or spec.shape is None:
        return None
    shape = tuple(int(d) if isinstance(d, int) else dims.get(d) for d in spec.shape)
    if all(isinstance(d, int) for d in spec.shape):
        return _NpyCheck(np.dtype(spec.dtype), shape)
    if all(n is None for d, n in zip(spec.shape, shape, strict=True) if isinstance(d, str)):
        return None  # no dim bound: a variable-size field, as before
    return _NpyCheck(np.dtype(spec.dtype), shape, tuple(spec.shape))


class ClsCast:
    """Cast a ``cls`` int to a numpy scalar type (a class, so it pickles; see :class:`_NpyCheck`)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def __call__(self, value: Any) -> Any:
        try:
            return self.dtype.type(value)
        except (OverflowError, ValueError) as exc:
            raise SchemaMismatch(
                f"value {value!r} does not fit dtype {self.dtype}: {exc}"
            ) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClsCast) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __repr__(self) -> str:
        return f"ClsCast({self.dtype})"


def cls_cast(spec: FieldSpec) -> ClsCast | None:
    """Cast a ``cls`` int to the numpy scalar type the schema declares (``int64`` ...)."""
    if spec.dtype is None:
        return None
    try:
        dtype = np.dtype(spec.dtype)
    except TypeError:
        return None
    if dtype.kind not in "biuf":
        return None  # a non-numeric dtype name: keep the Python int
    return ClsCast(dtype)


class Then:
    """``post(fn(buf))``: a decoder followed by its schema check (picklable)."""

    __slots__ = ("fn", "post")

    def __init__(self, fn: Decoder, post: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.post = post

    def __call__(self, buf: Any) -> Any:
        return self.post(self.fn(buf))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Then) and (self.fn, self.post) == (other.fn, other.post)

    def __hash__(self) -> int:
        return hash((self.fn, self.post))

    def __repr__(self) -> str:
        return f"Then({self.fn!r}, {self.post!r})"


class NoneOr:
    """``post(value)``, None for None: the check of an optional field (picklable)."""

    __slots__ = ("post",)

    def __init__(self, post: Callable[[Any], Any]) -> None:
        self.post = post

    def __call__(self, value: Any) -> Any:
        return None if value is None else self.post(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoneOr) and self.post == other.post

    def __hash__(self) -> int:
        return hash(self.post)
