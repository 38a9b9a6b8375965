"""A joined read (:meth:`Store.read_joined <wdsloader.io.store.Store.read_joined>`) under way or
done: what the batch reader starts for a group of batches and waits for when it needs them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from wdsloader.io.ranges import Request
from wdsloader.io.store import Store

__all__ = ["Done", "Joined", "start_joined"]


class Joined(Protocol):
    """A joined read: :meth:`result` is the buffer and where each range starts in it (waiting
    for them where the read is under way), or raises the read's error."""

    def result(self) -> tuple[bytes | np.ndarray, list[int]]:
        """The requests' bytes back to back, and where each starts."""
        ...

    def cancel(self) -> None:
        """Drop the requests not sent yet (the read is abandoned)."""
        ...


class Done:
    """A joined read already over: its buffer and positions."""

    def __init__(self, data: bytes | np.ndarray, positions: list[int]) -> None:
        self.data = data
        self.positions = positions

    def result(self) -> tuple[bytes | np.ndarray, list[int]]:
        """The buffer and where each range starts."""
        return self.data, self.positions

    def cancel(self) -> None:
        """Nothing to cancel."""


def start_joined(
    store: Store, requests: Sequence[Request], out: np.ndarray | None = None
) -> Joined:
    """``store.start_joined(requests, out)`` where the store has it (a remote store: the
    requests queued behind those of the reads started before, not waited for), else
    ``store.read_joined(requests, out)``, read now. ``out``: a uint8 array the bytes go to
    when it is large enough (a pooled buffer: no new memory faulted in per read)."""
    start = getattr(store, "start_joined", None)
    if start is None:
        return Done(*store.read_joined(requests, out))
    joined: Joined = start(requests, out)
    return joined
