"""Sequence packing planned from the documents' lengths: which documents (or pieces of them)
make each row of ``max_tokens`` tokens, before any byte is read.

:func:`plan_packs` takes the lengths of the documents of one worker's epoch, in the order the plan
yields them, and packs them with best-fit decreasing within windows of ``window`` consecutive
documents: within a window the pieces are placed longest first (ties: earlier document first)
into the open row with the least room that still holds them, a new row when none does. Rows
never span windows, so a document is packed with documents near it in the epoch order (the
shuffle is kept) and a pack is known once its window is. A document longer than ``max_tokens`` is
cut into consecutive pieces of ``max_tokens`` tokens and a last shorter piece
(``too_long="split"``), or refused (``too_long="error"``).

Every document is in exactly one row, or each of its pieces is; the packs of a window are
ordered by the first document they hold, and a row's pieces by document and start. Pure, no I/O:
the same lengths give the same packs on every process. :func:`greedy_packs` is the naive
baseline (concatenate in order, a new row when the next document does not fit).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

TooLong = Literal["split", "error"]
TOO_LONG: tuple[TooLong, ...] = ("split", "error")


class Piece(NamedTuple):
    """Tokens ``[start, stop)`` of document ``doc`` (its position in the lengths given)."""

    doc: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


Pack = tuple[Piece, ...]  # one row: its pieces in document order


@dataclass(frozen=True, slots=True, kw_only=True)
class Packing:
    """How documents are packed into rows: at most ``max_tokens`` tokens of field ``field`` a
    row, best-fit decreasing within windows of ``window`` documents, a document over
    ``max_tokens`` split into pieces or refused (``too_long``). See :func:`plan_packs`."""

    max_tokens: int
    field: str = "input_ids"
    window: int = 2048
    too_long: TooLong = "split"

    def __post_init__(self) -> None:
        for name in ("max_tokens", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Packing.{name} must be a positive int, got {value!r}")
        if not isinstance(self.field, str) or not self.field:
            raise ValueError(f"Packing.field must be a non-empty str, got {self.field!r}")
        if self.too_long not in TOO_LONG:
            raise ValueError(f"Packing.too_long must be one of {TOO_LONG}, got {self.too_long!r}")

    def plan(self, lengths: Sequence[int] | npt.NDArray[np.integer]) -> list[Pack]:
        """:func:`plan_packs` of ``lengths`` with these options."""
        return plan_packs(lengths, self.max_tokens, window=self.window, too_long=self.too_long)


class DocumentTooLongError(ValueError):
    """A document is longer than ``max_tokens`` and ``too_long="error"`` was asked for."""


def _check(lengths: Sequence[int] | npt.NDArray[np.integer], max_tokens: int, window: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError("lengths must be a 1-d sequence of ints")
    if arr.size and int(arr.min()) < 0:
        doc = int(np.argmin(arr))
        raise ValueError(f"document {doc} has a negative length {int(arr[doc])}")


def split_pieces(doc: int, length: int, max_tokens: int, too_long: TooLong) -> list[Piece]:
    """The pieces of one document: itself when it fits, else consecutive pieces of
    ``max_tokens`` tokens and a last shorter one (``"split"``), or an error (``"error"``)."""
    if length <= max_tokens:
        return [Piece(doc, 0, length)]
    if too_long == "error":
        raise DocumentTooLongError(
            f"document {doc} has {length} tokens, more than max_tokens={max_tokens} "
            f'(too_long="split" cuts it into pieces)'
        )
    return [Piece(doc, s, min(s + max_tokens, length)) for s in range(0, length, max_tokens)]


def _best_fit(pieces: list[Piece], max_tokens: int) -> list[Pack]:
    """Best-fit decreasing of one window's pieces; the rows ordered by their first document."""
    order = sorted(pieces, key=lambda p: (-p.length, p.doc, p.start))
    rows: list[list[Piece]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row), sorted: the open rows
    for piece in order:
        i = bisect.bisect_left(room, (piece.length, -1))
        if i < len(room):
            free, row = room.pop(i)
        else:
            free, row = max_tokens, len(rows)
            rows.append([])
        rows[row].append(piece)
        if free - piece.length > 0:
            bisect.insort(room, (free - piece.length, row))
    packs = [tuple(sorted(r, key=lambda p: (p.doc, p.start))) for r in rows]
    packs.sort(key=lambda pack: (pack[0].doc, pack[0].start))
    return packs


def plan_packs(
    lengths: Sequence[int] | npt.NDArray[np.integer],
    max_tokens: int,
    *,
    window: int = 2048,
    too_long: TooLong = "split",
) -> list[Pack]:
    """The rows of at most ``max_tokens`` tokens that pack documents of ``lengths`` (in epoch
    order), best-fit decreasing within windows of ``window`` documents (see the module's text)."""
    _check(lengths, max_tokens, window)
    if too_long not in TOO_LONG:
        raise ValueError(f"too_long must be one of {TOO_LONG}, got {too_long!r}")
    values = [int(n) for n in np.asarray(lengths).tolist()]
    packs: list[Pack] = []
    for lo in range(0, len(values), window):
        pieces: list[Piece] = []
        for doc in range(lo, min(lo + window, len(values))):
            pieces.extend(split_pieces(doc, values[doc], max_tokens, too_long))
        packs.extend(_best_fit(pieces, max_tokens))
    return packs


def greedy_packs(
    lengths: Sequence[int] | npt.NDArray[np.integer],
    max_tokens: int,
    *,
    too_long: TooLong = "split",
) -> list[Pack]:
    """The naive baseline: documents concatenated in order, a new row when the next one (or
    piece) does not fit in the current one."""
    _check(lengths, max_tokens, 1)
    packs: list[Pack] = []
    row: list[Piece] = []
    used = 0
    for doc, n in enumerate(np.asarray(lengths).tolist()):
        for piece in split_pieces(doc, int(n), max_tokens, too_long):
            if row and used + piece.length > max_tokens:
                packs.append(tuple(row))
                row, used = [], 0
            row.append(piece)
            used += piece.length
    if row:
        packs.append(tuple(row))
    return packs


def pack_tokens(pack: Pack) -> int:
    """The tokens a row holds (the rest of its ``max_tokens`` is padding)."""
    return sum(p.length for p in pack)


def packing_efficiency(packs: Sequence[Pack], max_tokens: int) -> float:
    """Non-pad tokens over all tokens of ``packs`` as rows of ``max_tokens`` (1.0 when empty)."""
    if not packs:
        return 1.0
    return sum(pack_tokens(p) for p in packs) / (len(packs) * max_tokens)
