"""The stand-in for a batch whose every sample failed under ``on_error="skip"``: the samples
that decode of the next batch of the worker that has any, so a rank still yields
``len(loader)`` batches and resume and DDP stay exact."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.errors import SkipLimitError

__all__ = ["Refill"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Refill:
    """The samples that stand in for batches whose every sample failed: found by searching
    the worker's batches after ``searched_from`` (wrapping round) up to ``found``; every batch
    in between failed too, so the same samples serve all of them."""

    searched_from: int = -1
    found: int = -1
    samples: list[dict[str, Any]] | None = None

    def covers(self, index: int) -> bool:
        a, f = self.searched_from, self.found
        if self.samples is None:
            return False
        return a < index < f if a < f else (index > a or index < f)

    def search(
        self,
        index: int,
        batches: Sequence[np.ndarray],
        reader: Any,
        decode: Callable[..., list[dict[str, Any]]],
        where: str,
        split: str,
        last_skip: str,
    ) -> None:
        """Find (unless already found) the samples that stand in for batch ``index``: those
        ``decode(raw, count=False)`` gives for the next batch of ``batches`` that has any
        (wrapping round); a SkipLimitError naming ``where`` (the worker) and ``split`` when none
        has."""
        if not self.covers(index):
            self.searched_from, self.samples = index, None
            for step in range(1, len(batches)):
                j = (index + step) % len(batches)
                (raw,) = reader.read([batches[j]])
                samples = decode(raw, count=False)
                if samples:
                    self.found, self.samples = j, samples
                    break
            else:
                raise SkipLimitError(
                    f"on_error='skip': no sample of the {len(batches)} batches of {where} "
                    f"could be decoded (split {split!r}); last error: {last_skip}"
                )
        log.warning(
            "every sample of batch %d of %s failed: yielding the %d samples of its batch %d "
            "in its place",
            index,
            where,
            len(self.samples or ()),
            self.found,
        )
