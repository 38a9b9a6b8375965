"""Which start method DataLoader workers use, and a check that the dataset can reach them.

Under ``spawn`` and ``forkserver`` (macOS's default, and Linux's from Python 3.14) every worker
receives the dataset object by pickle; under ``fork`` it inherits it. A lambda or closure given
as a collator, a decoder or a curriculum schedule pickles by reference and fails, so
:func:`check_sendable` tries it at loader creation and names the part at fault instead of
letting the first worker die with "Can't pickle local object".
"""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

# the attributes of the dataset object that can hold a user's objects, in the words of
# create_loader's arguments (the rest is ours: plain data and classes that pickle; pickling
# it here would cost as much as a worker's start for a manifest of many shards)
_PARTS = {
    "collate_fn": "collate_fn",
    "decoder": "decoder (a decoder registered with register_decoder)",
    "curriculum": "curriculum (its schedule)",
    "planner": "mix plan (its batching strategy or weights schedule)",
    "store": "storage options (storage_options / read_options)",
}


def start_method(context: Any = None) -> str:
    """The start method DataLoader workers get with ``multiprocessing_context=context``
    (None: the process's default, without fixing it as a side effect)."""
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True)
        return method or multiprocessing.get_all_start_methods()[0]
    if isinstance(context, str):
        return context
    return context.get_start_method()


def check_sendable(dataset: Any, context: Any = None) -> None:
    """Raise ValueError naming the part of ``dataset`` that cannot be pickled, when its workers
    are started by ``spawn`` or ``forkserver`` (a lambda, a closure, an open handle...)."""
    method = start_method(context)
    if method == "fork":
        return
    for name, what in _PARTS.items():
        value = getattr(dataset, name, None)
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ValueError(
                f"create_loader: the {what} cannot be sent to DataLoader workers started by "
                f"{method!r} ({exc}): use a module-level function or an instance of a "
                "module-level class instead of a lambda or a closure (or "
                "multiprocessing_context='fork' where the platform has it)"
            ) from exc
