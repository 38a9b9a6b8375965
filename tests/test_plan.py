"""The sample plan: exact partitioning over ranks and workers, shuffling, exact and elastic resume.

Most properties are checked against a naive reference written straight from the specification
(whole arrays, Python loops): the real plan must equal it, except inside a shuffle window, where it must
be a permutation of the reference's window.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from wdsloader.plan import (
    PlanConfig,
    Resume,
    epoch_dropped,
    epoch_order,
    epoch_padding,
    interleave,
    next_resume,
    num_batches,
    rank_batches,
    shard_of,
    worker_batches,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

counts_st = st.lists(st.integers(0, 40), min_size=0, max_size=8).map(tuple)


@st.composite
def configs(draw, counts=None, seed=None, shuffle=None, span=None):
    """A PlanConfig over the whole parameter space (shared fields fixed when given)."""
    return PlanConfig(
        counts=draw(counts_st) if counts is None else counts,
        batch_size=draw(st.integers(1, 17)),
        world_size=draw(st.integers(1, 8)),
        num_workers=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**32 - 1)) if seed is None else seed,
        shuffle=draw(st.booleans()) if shuffle is None else shuffle,
        drop_last=draw(st.booleans()),
        span=draw(st.integers(1, 5)) if span is None else span,
        window=draw(st.integers(0, 50)),
    )


def same_topology_family(cfg: PlanConfig):
    """Configs that may resume elastically from ``cfg`` (same counts, seed, shuffle, span)."""
    return configs(counts=cfg.counts, seed=cfg.seed, shuffle=cfg.shuffle, span=cfg.span)


# ----------------------------------------------------------------------------- the reference


def ref_chunks(cfg: PlanConfig, epoch: int, seq: np.ndarray) -> list[list[np.ndarray]]:
    """Per rank, per plan worker: the worker's chunk in read order (before the window shuffle).

    ``seq`` is the source order (the epoch order, or what is left of it after a resume).
    """
    m, world, bsz, nw = len(seq), cfg.world_size, cfg.batch_size, cfg.num_workers
    if cfg.drop_last:
        per_rank = (m // (world * bsz)) * bsz
        if not cfg.shuffle and m:
            seq = np.roll(seq, -((epoch * (m - world * per_rank)) % m))
        seq = seq[: world * per_rank]
    else:
        per_rank = -(-m // world)
        seq = np.resize(seq, world * per_rank) if m else seq
    nb = -(-per_rank // bsz)
    out = []
    for r in range(world):
        rank_seq = seq[r * per_rank : (r + 1) * per_rank]
        chunks: list[np.ndarray] = [np.zeros(0, np.int64)] * nw
        if nb:
            last = (nb - 1) % nw
            pos = 0
            for i in range(nw):
                p = (last + 1 + i) % nw
                take = min(len(range(p, nb, nw)) * bsz, per_rank - pos)
                chunks[p] = rank_seq[pos : pos + take]
                pos += take
            assert pos == per_rank
        out.append(chunks)
    return out


def assert_worker_matches(cfg: PlanConfig, got: list[np.ndarray], chunk: np.ndarray) -> None:
    """``got`` (a worker's batches) is ``chunk`` cut into batches, shuffled only inside windows."""
    bsz = cfg.batch_size
    assert [len(b) for b in got] == [len(chunk[i : i + bsz]) for i in range(0, len(chunk), bsz)]
    flat = np.concatenate(got) if got else np.zeros(0, np.int64)
    if cfg.shuffle and cfg.window > 1:
        w = cfg.window
        for i in range(0, len(chunk), w):
            assert sorted(flat[i : i + w].tolist()) == sorted(chunk[i : i + w].tolist())
    else:
        assert np.array_equal(flat, chunk)


def assert_batches_equal(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.int64 and y.dtype == np.int64
        assert np.array_equal(x, y)


def flat(batches: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(batches) if batches else np.zeros(0, np.int64)


def consumed_by(state: Resume, epoch: int) -> np.ndarray:
    """Every id the ranks had yielded when ``state`` was saved (the whole chain of resumes)."""
    cfg = state.config
    got = [
        flat(rank_batches(cfg, epoch, r, state.prior)[: state.batches_done])
        for r in range(cfg.world_size)
    ]
    before = consumed_by(state.prior, epoch) if state.prior is not None else np.zeros(0, np.int64)
    return np.concatenate([before, *got])


def remaining_order(cfg: PlanConfig, epoch: int, consumed: np.ndarray) -> np.ndarray:
    order = epoch_order(cfg, epoch)
    return order[~np.isin(order, consumed)]


def check_plan_against_reference(cfg: PlanConfig, epoch: int, seq: np.ndarray, resume=None) -> None:
    """Every worker of every rank equals the reference; ranks agree on batch counts and sizes."""
    chunks = ref_chunks(cfg, epoch, seq)
    nb = num_batches(cfg, epoch=epoch, resume=resume)
    sizes = None
    for r in range(cfg.world_size):
        per_worker = [worker_batches(cfg, epoch, r, w, resume) for w in range(cfg.num_workers)]
        for w in range(cfg.num_workers):
            assert_worker_matches(cfg, per_worker[w], chunks[r][w])
        ranked = rank_batches(cfg, epoch, r, resume)
        assert_batches_equal(ranked, interleave(per_worker))
        assert len(ranked) == nb
        rank_sizes = [len(b) for b in ranked]
        assert sizes is None or rank_sizes == sizes
        sizes = rank_sizes
        assert all(s == cfg.batch_size for s in rank_sizes[:-1])
        if cfg.drop_last and rank_sizes:
            assert rank_sizes[-1] == cfg.batch_size


# --------------------------------------------------------------------------- step 1: the order


@FAST
@given(cfg=configs(), epoch=st.integers(0, 5))
def test_epoch_order_is_a_permutation_that_keeps_spans_together(cfg, epoch):
    order = epoch_order(cfg, epoch)
    n = cfg.num_samples
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    if not cfg.shuffle:
        assert np.array_equal(order, np.arange(n))
        return
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    _, local = shard_of(np.arange(n), cfg.counts)
    inner = np.flatnonzero(local % cfg.span != 0)  # not the first sample of its span
    assert np.all(pos[inner] == pos[inner - 1] + 1)


@FAST
@given(cfg=configs(), epoch=st.integers(0, 5))
def test_epoch_order_ignores_topology_and_is_deterministic(cfg, epoch):
    other = dataclasses.replace(
        cfg, batch_size=3, world_size=5, num_workers=2, drop_last=not cfg.drop_last, window=7
    )
    np.random.seed(epoch)  # the global RNG must play no part
    a = epoch_order(cfg, epoch)
    np.random.seed(epoch + 1)
    assert np.array_equal(a, epoch_order(other, epoch))


@FAST
@given(
    counts=st.lists(st.integers(0, 40), min_size=2, max_size=8).map(tuple),
    span=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 50),
)
def test_epochs_and_seeds_give_different_orders(counts, span, seed, epoch):
    n_spans = sum(-(-c // span) for c in counts)
    assume(n_spans >= 12)  # two of 12! orders coincide with probability 2e-9
    cfg = PlanConfig(counts=counts, batch_size=1, seed=seed, span=span)
    order = epoch_order(cfg, epoch)
    assert not np.array_equal(order, epoch_order(cfg, epoch + 1))
    reseeded = PlanConfig(counts=counts, batch_size=1, seed=(seed + 1) % 2**32, span=span)
    assert not np.array_equal(order, epoch_order(reseeded, epoch))


def test_spans_are_permuted_individually_not_shards():
    cfg = PlanConfig(counts=(40,) * 5, batch_size=1, span=3, seed=0)
    order = epoch_order(cfg, 0)
    boundaries = np.array([s * 40 + local for s in range(5) for local in range(3, 40, 3)])
    pos = np.empty(200, np.int64)
    pos[order] = np.arange(200)
    kept = np.mean(pos[boundaries] == pos[boundaries - 1] + 1)
    assert kept < 0.1  # span boundaries inside a shard are almost always broken


def test_plan_is_pinned():
    """Changing the RNG use would break every saved resume state; this golden plan catches it."""
    cfg = PlanConfig(
        counts=(3, 0, 5, 7), batch_size=2, world_size=2, num_workers=3, span=2, window=3, seed=1
    )
    assert epoch_order(cfg, 0).tolist() == [10, 11, 3, 4, 0, 1, 8, 9, 5, 6, 14, 7, 12, 13, 2]
    assert [b.tolist() for b in rank_batches(cfg, 0, 0)] == [[11, 10], [3, 4], [0, 1]]
    assert [b.tolist() for b in rank_batches(cfg, 0, 1)] == [[8, 9], [6, 5], [14, 7]]


# ---------------------------------------------------------------- steps 2-3: ranks and workers


@FAST
@given(cfg=configs(), epoch=st.integers(0, 5))
def test_ranks_and_workers_follow_the_reference(cfg, epoch):
    check_plan_against_reference(cfg, epoch, epoch_order(cfg, epoch))


@FAST
@given(cfg=configs(), epoch=st.integers(0, 5))
def test_every_sample_exactly_once_up_to_drop_and_pad(cfg, epoch):
    n = cfg.num_samples
    everything = flat([b for r in range(cfg.world_size) for b in rank_batches(cfg, epoch, r)])
    seen = np.bincount(everything, minlength=n)
    world_batch = cfg.world_size * cfg.batch_size
    assert num_batches(cfg) == len(rank_batches(cfg, epoch, 0))
    if cfg.drop_last:
        assert epoch_padding(cfg) == 0
        assert seen.max(initial=0) <= 1
        assert epoch_dropped(cfg) == n - everything.size == n % world_batch
        assert epoch_dropped(cfg) < world_batch
        dropped = np.flatnonzero(seen == 0)
        order = epoch_order(cfg, epoch)
        if cfg.shuffle:
            assert sorted(dropped.tolist()) == sorted(order[n - dropped.size :].tolist())
    else:
        assert epoch_dropped(cfg) == 0
        assert seen.min(initial=1) >= 1
        assert epoch_padding(cfg) == everything.size - n
        assert everything.size == cfg.world_size * (-(-n // cfg.world_size))
        order = epoch_order(cfg, epoch)
        if n:
            repeats = np.resize(order, epoch_padding(cfg))  # the start of the order, wrapped
            assert np.array_equal(seen - 1, np.bincount(repeats, minlength=n))


def test_dropped_samples_rotate_with_the_epoch_without_shuffle():
    cfg = PlanConfig(counts=(7, 6), batch_size=2, world_size=2, shuffle=False)
    assert epoch_dropped(cfg) == 1
    missing = []
    for epoch in range(13):
        seen = flat([b for r in range(2) for b in rank_batches(cfg, epoch, r)])
        missing.append(int(np.setdiff1d(np.arange(13), seen)[0]))
    assert missing == [12, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


def test_padding_wraps_when_fewer_samples_than_ranks():
    cfg = PlanConfig(counts=(2, 0, 1), batch_size=4, world_size=8, drop_last=False, shuffle=False)
    got = [flat(rank_batches(cfg, 0, r)).tolist() for r in range(8)]
    assert got == [[0], [1], [2], [0], [1], [2], [0], [1]]
    assert epoch_padding(cfg) == 5 and num_batches(cfg) == 1


def test_workers_read_contiguous_chunks_and_the_last_worker_holds_the_tail():
    cfg = PlanConfig(counts=(23,), batch_size=3, num_workers=3, shuffle=False, drop_last=False)
    per_worker = [[b.tolist() for b in worker_batches(cfg, 0, 0, w)] for w in range(3)]
    # 8 batches: worker 1 yields rank batch 7, the partial one, so its chunk is the tail; the others
    # follow the round-robin from there (worker 2, then worker 0).
    assert per_worker == [
        [[6, 7, 8], [9, 10, 11], [12, 13, 14]],
        [[15, 16, 17], [18, 19, 20], [21, 22]],
        [[0, 1, 2], [3, 4, 5]],
    ]
    assert [b.tolist()[0] for b in rank_batches(cfg, 0, 0)] == [6, 15, 0, 9, 18, 3, 12, 21]


@FAST
@given(cfg=configs(), epoch=st.integers(0, 3))
def test_window_shuffle_mixes_within_windows_only_and_is_seeded_per_worker(cfg, epoch):
    assume(cfg.shuffle and cfg.window > 1)
    a = [worker_batches(cfg, epoch, 0, w) for w in range(cfg.num_workers)]
    unshuffled = dataclasses.replace(cfg, window=0)
    b = [worker_batches(unshuffled, epoch, 0, w) for w in range(cfg.num_workers)]
    for got, plain in zip(a, b, strict=True):
        assert_worker_matches(cfg, got, flat(plain))


def test_window_shuffle_actually_shuffles():
    cfg = PlanConfig(counts=(1000,), batch_size=10, window=50, span=1000, seed=3)
    stream = flat(rank_batches(cfg, 0, 0))
    assert sorted(stream[:50].tolist()) == list(range(50))
    assert not np.array_equal(stream[:50], np.arange(50))
    other = PlanConfig(counts=(1000,), batch_size=10, window=50, span=1000, seed=3, world_size=2)
    assert not np.array_equal(
        flat(rank_batches(other, 0, 0))[:50], flat(rank_batches(other, 0, 1))[:50] - 500
    )


def test_plan_functions_do_not_touch_the_global_rng():
    cfg = PlanConfig(counts=(50, 30), batch_size=4, world_size=2, num_workers=2, window=9, span=2)
    np.random.seed(123)
    state = np.random.get_state()
    rank_batches(cfg, 1, 1, Resume(PlanConfig(counts=(50, 30), batch_size=3, span=2), 5))
    after = np.random.get_state()
    assert all(np.array_equal(x, y) for x, y in zip(state[1:3], after[1:3], strict=True))


# -------------------------------------------------------------------------------------- resume


@FAST
@given(cfg=configs(), epoch=st.integers(0, 3), data=st.data())
def test_exact_resume_continues_the_uninterrupted_run(cfg, epoch, data):
    nb = num_batches(cfg)
    ks = (
        range(nb + 1) if nb <= 12 else {0, nb, *data.draw(st.lists(st.integers(0, nb), max_size=4))}
    )
    for r in range(cfg.world_size):
        full = rank_batches(cfg, epoch, r)
        full_workers = [worker_batches(cfg, epoch, r, w) for w in range(cfg.num_workers)]
        for k in ks:
            state = Resume(cfg, k)
            assert num_batches(cfg, epoch=epoch, resume=state) == nb - k
            assert_batches_equal(rank_batches(cfg, epoch, r, state), full[k:])
            resumed = [worker_batches(cfg, epoch, r, i, state) for i in range(cfg.num_workers)]
            assert_batches_equal(interleave(resumed), full[k:])
            for i, got in enumerate(resumed):  # DataLoader worker i plays plan worker (k + i) % W
                p = (k + i) % cfg.num_workers
                done = len(range(p, k, cfg.num_workers))
                assert_batches_equal(got, full_workers[p][done:])


@FAST
@given(cfg=configs(), epoch=st.integers(0, 3), data=st.data())
def test_resuming_twice_equals_the_uninterrupted_run(cfg, epoch, data):
    nb = num_batches(cfg)
    k1 = data.draw(st.integers(0, nb))
    k2 = data.draw(st.integers(0, nb - k1))
    state = next_resume(cfg, next_resume(cfg, None, k1), k2)
    assert state == Resume(cfg, k1 + k2)
    assert_batches_equal(rank_batches(cfg, epoch, 0, state), rank_batches(cfg, epoch, 0)[k1 + k2 :])


@SLOW
@given(data=st.data(), epoch=st.integers(0, 3))
def test_elastic_resume_delivers_the_rest_exactly_once(data, epoch):
    old = data.draw(configs())
    new = data.draw(same_topology_family(old))
    k = data.draw(st.integers(0, num_batches(old)))
    state = Resume(old, k)
    consumed = consumed_by(state, epoch)
    rest = remaining_order(old, epoch, consumed)
    if new != old:  # the new plan is the reference plan over what is left of the epoch order
        check_plan_against_reference(new, epoch, rest, state)
    delivered = flat([b for r in range(new.world_size) for b in rank_batches(new, epoch, r, state)])
    m = rest.size
    if new != old:
        assert not np.isin(delivered, consumed).any()
    if new.drop_last:
        assert np.unique(delivered).size == delivered.size
        assert epoch_dropped(new, epoch=epoch, resume=state) == m - delivered.size
        assert m - delivered.size < new.world_size * new.batch_size
    else:
        assert set(delivered.tolist()) == set(rest.tolist())
        assert epoch_padding(new, epoch=epoch, resume=state) == delivered.size - m
    covered = np.union1d(consumed, delivered)
    assert covered.size + epoch_dropped(new, epoch=epoch, resume=state) == old.num_samples


@SLOW
@given(data=st.data(), epoch=st.integers(0, 2))
def test_resume_chains_elastic_then_exact_then_elastic(data, epoch):
    c1 = data.draw(configs())
    c2 = data.draw(same_topology_family(c1))
    c3 = data.draw(same_topology_family(c1))
    assume(c2 != c1 and c3 != c2)
    s1 = Resume(c1, data.draw(st.integers(0, num_batches(c1))))
    run2 = [rank_batches(c2, epoch, r, s1) for r in range(c2.world_size)]
    k2 = data.draw(st.integers(0, len(run2[0])))
    s2 = next_resume(c2, s1, k2)
    assert s2 == Resume(c2, k2, s1)
    for r in range(c2.world_size):  # exact resume of the elastically resumed run
        assert_batches_equal(rank_batches(c2, epoch, r, s2), run2[r][k2:])
    consumed = consumed_by(s2, epoch)
    assert np.array_equal(
        np.sort(consumed),
        np.sort(np.concatenate([consumed_by(s1, epoch), *[flat(b[:k2]) for b in run2]])),
    )
    rest = remaining_order(c1, epoch, consumed)
    check_plan_against_reference(c3, epoch, rest, s2)  # elastic again, from the chained state
    delivered = flat([b for r in range(c3.world_size) for b in rank_batches(c3, epoch, r, s2)])
    assert not np.isin(delivered, consumed).any()
    assert np.union1d(delivered, rest).size == rest.size


def test_elastic_resume_example_by_hand():
    old = PlanConfig(
        counts=(3, 0, 5, 7), batch_size=2, world_size=2, num_workers=3, span=2, window=3, seed=1
    )
    new = PlanConfig(
        counts=(3, 0, 5, 7), batch_size=3, num_workers=2, span=2, window=3, seed=1, drop_last=False
    )
    # old ranks yielded [11, 10], [3, 4] and [8, 9], [6, 5]; 12, 13, 2 were the dropped tail.
    rest = [0, 1, 14, 7, 12, 13, 2]
    got = rank_batches(new, 0, 0, Resume(old, 2))
    assert sorted(flat(got).tolist()) == sorted(rest)
    assert [sorted(b.tolist()) for b in got] == [[7, 12, 13], [0, 1, 14], [2]]


def test_elastic_resume_where_the_consumed_range_wraps_around_the_order():
    # Without shuffle, epoch 5 rotates the order by 5 * dropped = 5: positions 5..9, then 0..3.
    old = PlanConfig(counts=(10,), batch_size=3, shuffle=False)
    assert [b.tolist() for b in rank_batches(old, 5, 0)] == [[5, 6, 7], [8, 9, 0], [1, 2, 3]]
    new = PlanConfig(counts=(10,), batch_size=2, world_size=2, shuffle=False)
    got = [[b.tolist() for b in rank_batches(new, 5, r, Resume(old, 2))] for r in range(2)]
    assert got == [[[1, 2]], [[3, 4]]]
    # Padding wraps as well: 5 samples over 4 ranks pad 3, rank 3 yields 1 and 2 again (after 4, 0).
    padded = PlanConfig(counts=(5,), batch_size=1, world_size=4, shuffle=False, drop_last=False)
    assert [flat(rank_batches(padded, 0, r)).tolist() for r in range(4)] == [
        [0, 1],
        [2, 3],
        [4, 0],
        [1, 2],
    ]
    after = PlanConfig(counts=(5,), batch_size=5, shuffle=False, drop_last=False)
    assert [b.tolist() for b in rank_batches(after, 0, 0, Resume(padded, 2))] == []
    assert [b.tolist() for b in rank_batches(after, 0, 0, Resume(padded, 1))] == [[3]]


@pytest.mark.parametrize("field", ["counts", "seed", "shuffle", "span"])
def test_resume_rejects_a_different_dataset_or_order(field):
    old = PlanConfig(counts=(10, 10), batch_size=2, seed=1, span=2)
    changed = {"counts": (10, 11), "seed": 2, "shuffle": False, "span": 3}[field]
    new = dataclasses.replace(old, **{field: changed})
    with pytest.raises(ValueError, match=field):
        rank_batches(new, 0, 0, Resume(old, 1))


def test_resume_rejects_more_batches_than_the_epoch_has():
    cfg = PlanConfig(counts=(10,), batch_size=3)
    assert num_batches(cfg) == 3
    with pytest.raises(ValueError, match="batches_done=4"):
        rank_batches(cfg, 0, 0, Resume(cfg, 4))
    with pytest.raises(ValueError, match="batches_done=4"):
        rank_batches(PlanConfig(counts=(10,), batch_size=2), 0, 0, Resume(cfg, 4))
    with pytest.raises(ValueError, match="same config"):
        Resume(cfg, 1, Resume(cfg, 1))


# ----------------------------------------------------------------------------- validation, misc


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"world_size": 0},
        {"num_workers": 0},
        {"span": 0},
        {"window": -1},
        {"seed": -1},
        {"counts": (3, -1)},
        {"counts": (3, 1.5)},
        {"counts": "12"},
        {"batch_size": True},
        {"shuffle": 1},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PlanConfig(**{"counts": (4, 4), "batch_size": 2, **kwargs})


def test_config_normalises_counts_so_equal_configs_compare_equal():
    a = PlanConfig(counts=[np.int64(3), 4], batch_size=2)
    assert a == PlanConfig(counts=(3, 4), batch_size=2)
    assert a.counts == (3, 4) and a.num_samples == 7


def test_rank_worker_and_epoch_are_checked():
    cfg = PlanConfig(counts=(10,), batch_size=2, world_size=2, num_workers=2)
    with pytest.raises(ValueError, match="rank"):
        rank_batches(cfg, 0, 2)
    with pytest.raises(ValueError, match="worker"):
        worker_batches(cfg, 0, 0, 2)
    with pytest.raises(ValueError, match="epoch"):
        epoch_order(cfg, -1)


@FAST
@given(counts=counts_st)
def test_shard_of_inverts_the_concatenation(counts):
    n = sum(counts)
    shard, local = shard_of(np.arange(n), counts)
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    assert shard.dtype == np.int64 and local.dtype == np.int64
    assert np.array_equal(offsets[shard] + local, np.arange(n))
    assert np.all((local >= 0) & (local < np.asarray(counts, np.int64)[shard]))
    with pytest.raises(ValueError, match=str(n)):
        shard_of(np.array([n]), counts)


def test_shard_of_rejects_negative_ids():
    with pytest.raises(ValueError, match="-1"):
        shard_of(np.array([0, -1]), (3, 3))


class PreMadeBatches(IterableDataset):
    """DataLoader worker ``i`` yields ``lists[i]``."""

    def __init__(self, lists):
        self.lists = lists

    def __iter__(self):
        info = get_worker_info()
        return iter(self.lists[info.id if info else 0])


def test_interleave_matches_torch_dataloader_round_robin():
    # Unequal lengths, the first worker the shortest: exhausted workers must be skipped.
    lists = [[np.array([0, 1])], [np.array([10]), np.array([11, 12]), np.array([13])]]
    loader = DataLoader(PreMadeBatches(lists), batch_size=None, num_workers=2)
    got = [t.numpy() for t in loader]
    assert_batches_equal(got, interleave(lists))
    assert [b.tolist() for b in got] == [[0, 1], [10], [11, 12], [13]]


def test_shuffle_quality_on_100k_samples():
    from scipy.stats import spearmanr

    cfg = PlanConfig(counts=(2000,) * 50, batch_size=256, span=27, window=6800, seed=0)
    stream = flat(rank_batches(cfg, 0, 0))
    assert stream.size == 100_000 - 100_000 % 256
    rho = spearmanr(stream, np.arange(stream.size)).statistic
    assert abs(rho) < 0.05
    assert np.mean(np.abs(np.diff(stream))) / 100_000 >= 0.25
