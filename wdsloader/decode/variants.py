"""The curriculum as the batch decoders apply it: which variant each sample gets, and the zeros
of the synthetic variant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from wdsloader.decode.gather import resolve_shape
from wdsloader.format.manifest import FieldSpec

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum


class Variants:
    """A :class:`~wdsloader.curriculum.Curriculum` bound to a dataset: its output's
    :class:`FieldSpec` (``specs``), the zero value of its synthetic variant (``zero``) and the
    per-sample draw (:meth:`draw`) under the loader's seed (``seed``) unless the curriculum has
    its own.

    Raises ValueError when the dataset has no schema, when ``fields`` requests a variant field
    itself, or when the output's shape names a dim the manifest does not bind.
    """

    def __init__(
        self,
        curriculum: Curriculum,
        schema: Mapping[str, FieldSpec],
        dims: Mapping[str, int],
        fields: Sequence[str] | None,
        seed: int,
    ) -> None:
        if not schema or fields is None:
            raise ValueError("a curriculum needs a dataset schema (the manifest has none)")
        clash = [f for f in curriculum.fields if f in fields]
        if clash:
            raise ValueError(
                f"fields {clash} are variants of the curriculum output "
                f"{curriculum.output!r}; request {curriculum.output!r} instead"
            )
        self.curriculum = curriculum
        self.specs: dict[str, FieldSpec] = curriculum.output_specs(schema, dims)
        spec = self.specs[curriculum.output]
        shape = resolve_shape(spec.shape or [], dims)
        if shape is None:
            raise ValueError(
                f"curriculum output {curriculum.output!r}: shape {spec.shape} has a dim "
                f"not bound in the manifest's dims {dims}"
            )
        self.zero: np.ndarray = np.zeros(shape, dtype=np.dtype(spec.dtype))
        self.seed = curriculum.seed if curriculum.seed is not None else seed

    def draw(self, keys: Sequence[str], epoch: int, forced: int | None) -> np.ndarray:
        """The variant index of each sample (``forced``: the same for all)."""
        if forced is not None:
            return np.full(len(keys), forced, dtype=np.int64)
        return self.curriculum.draw(keys, epoch, self.seed)
