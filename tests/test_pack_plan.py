"""The plan of packed rows (wdsloader.plan.pack_plan): every document of the epoch in exactly one
pack (a split document's pieces each once), the same batches on every rank for world 1-8 x
workers 0-3, exact resume (the rest of the epoch identical), elastic resume (another topology
continues with the packs not yet consumed: nothing twice, nothing lost)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsloader.plan import Packing, PackPlanner, PlanConfig, Resume, interleave, next_resume
from wdsloader.plan.pack_plan import PackBatches, epoch_packs

MAX_TOKENS = 64


def _lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(2.5, 1.0, n).astype(np.int64) + 1, 5 * MAX_TOKENS)


def _planner(n: int, seed: int, *, world: int, workers: int, batch: int, drop_last: bool):
    counts = [n // 3, n - 2 * (n // 3), n // 3]
    cfg = PlanConfig(
        counts=counts, batch_size=batch, world_size=world, num_workers=max(1, workers),
        seed=seed, drop_last=drop_last, span=2,
    )  # fmt: skip
    packing = Packing(max_tokens=MAX_TOKENS, window=16)
    return PackPlanner(cfg, packing, _lengths(n, seed))


def _rank_rows(p: PackPlanner, epoch: int, rank: int, resume: Resume | None = None) -> list:
    """Rank ``rank``'s batches as its DataLoader yields them: each batch a list of rows."""
    lists = []
    for w in range(p.config.num_workers):
        b = p.worker_batches(epoch, rank, w, resume)
        assert isinstance(b, PackBatches)
        lists.append([b.layout(i) for i in range(len(b))])
    return interleave(lists)


def _pieces(batches: list) -> Counter:
    return Counter(piece for batch in batches for row in batch for piece in row)


def _assert_exactly_once(p: PackPlanner, epoch: int, pieces: Counter) -> None:
    """Every piece of every document once, and the pieces of a document cover its tokens."""
    assert max(pieces.values(), default=1) == 1
    by_doc: dict[int, list] = {}
    for piece in pieces:
        by_doc.setdefault(piece.doc, []).append(piece)
    assert sorted(by_doc) == list(range(p.config.num_samples))
    for doc, parts in by_doc.items():
        parts.sort(key=lambda x: x.start)
        assert parts[0].start == 0 and parts[-1].stop == int(p.lengths[doc])
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 300),
    seed=st.integers(0, 5),
    world=st.integers(1, 8),
    workers=st.integers(0, 3),
    batch=st.integers(1, 4),
    drop_last=st.booleans(),
)
def test_equal_batches_per_rank_and_every_document_once(n, seed, world, workers, batch, drop_last):
    p = _planner(n, seed, world=world, workers=workers, batch=batch, drop_last=drop_last)
    ranks = [_rank_rows(p, 1, r) for r in range(world)]
    assert {len(r) for r in ranks} == {p.num_batches(1)}
    assert all(len(rows) == batch for r in ranks for rows in r)  # fixed shape: B rows
    assert all(sum(x.length for x in row) <= MAX_TOKENS for r in ranks for b in r for row in b)
    pieces = _pieces([b for r in ranks for b in r])
    total = epoch_packs(p.config, p.packing, p.lengths, 1).size
    if drop_last:  # the remainder rows left out, nothing repeated
        assert p.dropped(1) < world * batch and p.padding(1) == 0
        assert max(pieces.values(), default=1) == 1
        if p.dropped(1) == 0:
            _assert_exactly_once(p, 1, pieces)
    else:  # every document once, and the repeated rows on top
        assert p.padding(1) < world * batch and p.dropped(1) == 0
        rows = Counter(tuple(row) for r in ranks for b in r for row in b)
        assert sum(rows.values()) == total + p.padding(1)
        _assert_exactly_once(p, 1, Counter(dict.fromkeys(pieces, 1)))


def test_the_packs_do_not_depend_on_the_topology_and_change_with_the_epoch() -> None:
    a = _planner(400, 1, world=1, workers=0, batch=2, drop_last=True)
    b = _planner(400, 1, world=5, workers=3, batch=7, drop_last=False)
    pa, pb = a.epoch_packs(0), b.epoch_packs(0)
    assert [pa.pack(i) for i in range(pa.size)] == [pb.pack(i) for i in range(pb.size)]
    pc = a.epoch_packs(1)
    assert [pa.pack(i) for i in range(pa.size)] != [pc.pack(i) for i in range(pc.size)]


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 4),
    workers=st.integers(0, 3),
    batch=st.integers(1, 3),
    stop=st.integers(0, 30),
    drop_last=st.booleans(),
)
def test_exact_resume_plays_the_rest_of_the_epoch(world, workers, batch, stop, drop_last) -> None:
    p = _planner(250, 2, world=world, workers=workers, batch=batch, drop_last=drop_last)
    k = min(stop, p.num_batches(0))
    resume = next_resume(p.config, None, k)
    for rank in range(world):
        full = _rank_rows(p, 0, rank)
        assert _rank_rows(p, 0, rank, resume) == full[k:]
    assert p.num_batches(0, resume) == p.num_batches(0) - k


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 8),
    workers=st.integers(0, 3),
    new_world=st.integers(1, 8),
    new_workers=st.integers(0, 3),
    batch=st.integers(1, 3),
    new_batch=st.integers(1, 3),
    stop=st.integers(0, 12),
    stop2=st.integers(0, 12),
)
def test_elastic_resume_continues_with_the_packs_not_yet_consumed(
    world, workers, new_world, new_workers, batch, new_batch, stop, stop2
) -> None:
    """Two topology changes within the epoch (drop_last=False: nothing left out); every piece
    is played at least once and none twice before the last round's repeats."""
    p = _planner(300, 3, world=world, workers=workers, batch=batch, drop_last=False)
    k = max(0, min(stop, p.num_batches(0) - 1))  # mid-epoch: before the last round's repeats
    first = [b for r in range(world) for b in _rank_rows(p, 0, r)[:k]]
    resume = next_resume(p.config, None, k)
    q = _planner(300, 3, world=new_world, workers=new_workers, batch=new_batch, drop_last=False)
    k2 = max(0, min(stop2, q.num_batches(0, resume) - 1))
    second = [b for r in range(new_world) for b in _rank_rows(q, 0, r, resume)[:k2]]
    resume2 = next_resume(q.config, resume, k2)
    third_p = _planner(300, 3, world=2, workers=1, batch=2, drop_last=False)
    ranks = [_rank_rows(third_p, 0, r, resume2) for r in range(2)]
    assert len({len(r) for r in ranks}) == 1
    third = [b for r in ranks for b in r]
    before = _pieces(first) + _pieces(second)
    assert max(before.values(), default=1) == 1
    played = before + _pieces(third)
    _assert_exactly_once(p, 0, Counter(dict.fromkeys(played, 1)))
    rows = sum(len(b) for b in first + second + third)
    total = p.epoch_packs(0).size
    repeated = rows - total
    assert 0 <= repeated < 2 * 2 * max(batch, new_batch, 2)


def test_a_resume_past_the_end_of_its_run_is_refused() -> None:
    p = _planner(100, 0, world=2, workers=1, batch=2, drop_last=True)
    n = p.num_batches(0)
    with pytest.raises(ValueError, match=f"batches_done={n + 1} exceeds the {n} batches per rank"):
        p.num_batches(0, Resume(p.config, n + 1))


def test_batches_name_each_document_once_in_order_of_its_rows() -> None:
    p = _planner(200, 4, world=2, workers=2, batch=3, drop_last=True)
    b = p.worker_batches(0, 1, 1, None)
    for i in range(len(b)):
        docs = [piece.doc for row in b.layout(i) for piece in row]
        assert b[i].tolist() == list(dict.fromkeys(docs))
