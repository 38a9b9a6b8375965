"""Where each source's stream stands when an epoch starts: the sum of its quotas over the
earlier epochs (:class:`EpochOffsets`), without summing every earlier epoch at every epoch."""

from __future__ import annotations

from collections.abc import Callable

from wdsloader.format.checks import as_int

__all__ = ["EpochOffsets"]

Quotas = tuple[int, ...]


class EpochOffsets:
    """The quotas of ``quotas(e)`` summed over the epochs before an epoch, per source.

    From epoch ``steady`` on the quotas no longer change (constant weights: 0; a schedule: the
    epoch where it ends; None: never known, as for a schedule from a function), so a later
    epoch costs two quota computations: the sum up to ``steady`` plus the steady quotas times
    the epochs since. Before ``steady`` the sums are walked epoch by epoch, and kept every
    ``every`` epochs and at the last epoch asked: a run that goes from one epoch to the next
    adds one epoch's quotas, a resume adds those since the nearest sum kept. ``quotas`` must
    be picklable for workers that start by spawn (a module-level function or a partial of one).
    """

    def __init__(
        self, quotas: Callable[[int], Quotas], steady: int | None, *, every: int = 256
    ) -> None:
        self.quotas = quotas
        self.steady = None if steady is None else as_int(steady, "steady", 0)
        self.every = as_int(every, "every", 1)
        self._kept: dict[int, Quotas] = {}  # epoch (a multiple of ``every``) -> sums before it
        self._last: tuple[int, Quotas] | None = None

    def __call__(self, epoch: int) -> Quotas:
        """Each source's quotas summed over epochs ``0 .. epoch - 1``."""
        epoch = as_int(epoch, "epoch", 0)
        if self.steady is None or epoch <= self.steady:
            return self._walk(epoch)
        base, steady = self._walk(self.steady), self.quotas(self.steady)
        return tuple(b + (epoch - self.steady) * q for b, q in zip(base, steady, strict=True))

    def _walk(self, epoch: int) -> Quotas:
        """The sums before ``epoch``, from the nearest sum kept at or before it."""
        if self._last is not None and self._last[0] == epoch:
            return self._last[1]
        # the kept sums are those at 0, every, 2 * every, ... up to the furthest walked
        start = min(epoch // self.every, len(self._kept) - 1) * self.every if self._kept else 0
        sums = self._kept.get(start)
        if self._last is not None and start <= self._last[0] <= epoch:
            start, sums = self._last
        if sums is None:
            sums = tuple(0 for _ in self.quotas(0))
        for e in range(start, epoch):
            if e % self.every == 0:
                self._kept[e] = sums
            sums = tuple(a + b for a, b in zip(sums, self.quotas(e), strict=True))
        if epoch % self.every == 0:
            self._kept[epoch] = sums
        self._last = (epoch, sums)
        return sums
