"""Fork safety of fsspec's shared event loop.

fsspec runs every async filesystem (HTTP, S3, GCS ...) on one event loop in a background thread.
A forked process (a DataLoader worker) inherits a copy of that loop object and of every
filesystem and session the parent made, but the loop's epoll instance is the *same* kernel object
in both processes. When the child drops an inherited session (our store re-opens its filesystem
after a fork, and fsspec clears its instance cache), the session's finalizer closes its pooled
connections through the inherited loop, which unregisters their sockets from that shared epoll:
the parent's loop then never hears of data on them, and the parent's next request on a pooled
keep-alive connection (for example the next ``create_loader`` reading ``manifest.json``) waits
until its read timeout. After a fork, the child's copy of the loop gets a selector of its own and
counts as not running, so nothing the child closes touches the parent's epoll.
"""

from __future__ import annotations

import os
import selectors
import sys
from typing import Any

_parent_loop: list[Any] = [None]


def _remember_loop() -> None:
    asyn = sys.modules.get("fsspec.asyn")
    _parent_loop[0] = asyn.loop[0] if asyn is not None else None


def _detach_loop_in_child() -> None:
    loop, _parent_loop[0] = _parent_loop[0], None
    if loop is not None:
        # private attributes of asyncio's selector loop: the only handles on its epoll and state
        loop._selector = selectors.DefaultSelector()
        loop._thread_id = None


def _forget_loop_in_parent() -> None:
    _parent_loop[0] = None


_registered: list[bool] = [False]


def install() -> None:
    """Register the fork hooks (once per process); called when the first filesystem is made."""
    if not _registered[0] and hasattr(os, "register_at_fork"):
        os.register_at_fork(
            before=_remember_loop,
            after_in_child=_detach_loop_in_child,
            after_in_parent=_forget_loop_in_parent,
        )
        _registered[0] = True
