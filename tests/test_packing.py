"""Sequence packing planned from lengths (wdsloader.plan.packing): every document in exactly one
row (or its pieces each in one), deterministic, rows within their window, the too-long policy,
and the efficiency of best-fit decreasing against greedy concatenation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsloader.plan.packing import (
    DocumentTooLongError,
    Pack,
    Piece,
    greedy_packs,
    pack_tokens,
    packing_efficiency,
    plan_packs,
)


def _lognormal(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).lognormal(6.0, 1.0, n)
    return np.maximum(1, np.ceil(x)).astype(np.int64)


def _assert_exactly_once(packs: list[Pack], lengths: list[int], max_tokens: int) -> None:
    """Each document's tokens covered once, by consecutive pieces; no row over max_tokens."""
    got: dict[int, list[Piece]] = {}
    for pack in packs:
        assert pack, "an empty row"
        assert pack_tokens(pack) <= max_tokens
        assert list(pack) == sorted(pack, key=lambda p: (p.doc, p.start))
        for piece in pack:
            got.setdefault(piece.doc, []).append(piece)
    assert sorted(got) == list(range(len(lengths)))
    for doc, pieces in got.items():
        pieces.sort(key=lambda p: p.start)
        bounds = [(p.start, p.stop) for p in pieces]
        expected = [
            (s, min(s + max_tokens, lengths[doc])) for s in range(0, lengths[doc], max_tokens)
        ]
        assert bounds == (expected or [(0, 0)]), f"document {doc}"


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=200),
    max_tokens=st.integers(1, 40),
    window=st.integers(1, 64),
)
def test_every_document_exactly_once(lengths: list[int], max_tokens: int, window: int) -> None:
    packs = plan_packs(lengths, max_tokens, window=window)
    _assert_exactly_once(packs, lengths, max_tokens)
    _assert_exactly_once(greedy_packs(lengths, max_tokens), lengths, max_tokens)
    # a row never holds documents of two windows
    for pack in packs:
        assert len({p.doc // window for p in pack}) == 1


def test_deterministic_and_ordered_by_first_document() -> None:
    lengths = _lognormal(5000, seed=3)
    a = plan_packs(lengths, 4096, window=1000)
    b = plan_packs(lengths.tolist(), 4096, window=1000)
    assert a == b
    for lo in range(0, 5000, 1000):
        firsts = [p[0] for p in a if lo <= p[0].doc < lo + 1000]
        assert firsts == sorted(firsts, key=lambda p: (p.doc, p.start))


def test_best_fit_decreasing_on_a_hand_made_window() -> None:
    # longest first: 7 -> new row A (room 3), 6 -> new B (4), 5 -> new C (5), 4 -> B (the
    # tightest room that holds it), 3 -> A, 2 -> C (room 3), 1 -> C
    packs = plan_packs([3, 6, 2, 5, 4, 7, 1], 10, window=7)
    assert packs == [
        (Piece(0, 0, 3), Piece(5, 0, 7)),
        (Piece(1, 0, 6), Piece(4, 0, 4)),
        (Piece(2, 0, 2), Piece(3, 0, 5), Piece(6, 0, 1)),
    ]


def test_efficiency_on_lognormal_lengths() -> None:
    lengths = _lognormal(20_000, seed=0)
    bfd = packing_efficiency(plan_packs(lengths, 4096, window=2000), 4096)
    greedy = packing_efficiency(greedy_packs(lengths, 4096), 4096)
    assert bfd >= 0.99
    assert greedy < 0.87
    assert packing_efficiency([], 4096) == 1.0


def test_too_long_split_cuts_consecutive_pieces() -> None:
    packs = plan_packs([9000, 10], 4096, window=8)
    pieces = sorted((p for pack in packs for p in pack), key=lambda p: (p.doc, p.start))
    assert pieces == [
        Piece(0, 0, 4096),
        Piece(0, 4096, 8192),
        Piece(0, 8192, 9000),
        Piece(1, 0, 10),
    ]
    assert len(packs) == 3  # the last piece (808) and the short document share a row


def test_too_long_error_names_the_document() -> None:
    with pytest.raises(DocumentTooLongError) as err:
        plan_packs([10, 4096, 4097], 4096, too_long="error")
    assert str(err.value) == (
        'document 2 has 4097 tokens, more than max_tokens=4096 (too_long="split" cuts it into '
        "pieces)"
    )
    with pytest.raises(DocumentTooLongError, match="document 0 has 5 tokens"):
        greedy_packs([5], 4, too_long="error")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be a positive int, got 0"),
        ({"window": 0}, "window must be a positive int, got 0"),
        ({"too_long": "drop"}, "too_long must be one of ('split', 'error'), got 'drop'"),
        ({"lengths": [3, -1]}, "document 1 has a negative length -1"),
        ({"lengths": [1.5]}, "lengths must be a 1-d sequence of ints"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"lengths": [1, 2], "max_tokens": 8, **kwargs}
    with pytest.raises(ValueError) as err:
        plan_packs(**args)  # type: ignore[arg-type]
    assert str(err.value) == message
