"""Where a decoder puts a batch's large arrays: memory the batch is sent in, inside a DataLoader
worker process (so that the array reaches the training process without a copy), else a plain
``np.empty``. The worker loop names the lender; decoders only call :func:`empty`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Lender = Callable[[int], "np.ndarray | None"]
_lender: list[Lender] = []


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A new array of ``shape`` and ``dtype``, contents undefined (lent memory when a lender is
    set and has some)."""
    dt = np.dtype(dtype)
    if _lender:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = _lender[-1](nbytes)
        if buf is not None:
            return buf.view(dt).reshape(shape)
    return np.empty(shape, dtype=dt)


def set_lender(lender: Lender | None) -> None:
    """Lend from ``lender`` from now on in this process (None: plain arrays again)."""
    _lender.clear()
    if lender is not None:
        _lender.append(lender)
