"""Iterations whose threads are stopped when the interpreter exits, while they can still run.

A daemon thread left running at exit is frozen by the interpreter's finalization wherever it
is; frozen inside torch's C++ code (a collate that released the GIL), it aborts the process
("terminate called without an active exception"). An iteration that starts threads registers
itself with :func:`stop_at_exit` and leaves with :func:`forget` once closed; at exit, one hook
closes those still open, each given :data:`EXIT_JOIN_S` to finish the item it is making.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol

__all__ = ["EXIT_JOIN_S", "Stoppable", "forget", "stop_at_exit"]

EXIT_JOIN_S = 10.0
"""At interpreter exit, how long an open iteration's threads may take to finish their item."""


class Stoppable(Protocol):
    """An iteration running threads: ``close(timeout)`` stops them and waits at most
    ``timeout`` seconds (None: until they are over)."""

    def close(self, timeout: float | None = None) -> None: ...


_OPEN: weakref.WeakSet[Stoppable] = weakref.WeakSet()  # registered, not closed yet


def stop_at_exit(iteration: Stoppable) -> None:
    """Close ``iteration`` at interpreter exit if it is still open then (held weakly: a
    collected iteration is forgotten)."""
    _OPEN.add(iteration)


def forget(iteration: Stoppable) -> None:
    """``iteration`` is closed: nothing to do for it at exit."""
    _OPEN.discard(iteration)


@atexit.register
def _close_open() -> None:
    for iteration in list(_OPEN):
        iteration.close(timeout=EXIT_JOIN_S)
