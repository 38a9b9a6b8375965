"""The plan at scale: the keyed span permutation, and the partition and resume guarantees for world
sizes up to 512 ranks with 1-8 workers (property tests on small synthetic shard counts)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdsloader.plan import (
    EpochOrder,
    KeyedPermutation,
    PlanConfig,
    Resume,
    epoch_dropped,
    epoch_order,
    num_batches,
    rank_batches,
    worker_batches,
)
from wdsloader.plan.order import BLOCK, order_of

FEW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def flat(batches) -> np.ndarray:
    return np.concatenate(batches) if len(batches) else np.zeros(0, np.int64)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), keys=st.lists(st.integers(0, 2**64 - 1), min_size=6, max_size=6))
def test_keyed_permutation_is_a_bijection_with_its_inverse(n, keys):
    perm = KeyedPermutation(n, np.array(keys, dtype=np.uint64))
    x = np.arange(n, dtype=np.int64)
    y = perm(x)
    assert y.dtype == np.int64 and np.array_equal(np.sort(y), x)
    assert np.array_equal(perm.inverse(y), x)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3 * BLOCK + 100),
    bounds=st.lists(st.integers(0, 3 * BLOCK + 100), min_size=2, max_size=2),
    keys=st.lists(st.integers(0, 2**64 - 1), min_size=6, max_size=6),
)
def test_images_kept_in_blocks_are_the_permutations_images(n, bounds, keys):
    """``images(a, b)`` (blocks of images kept and reused) equals the network evaluated on
    ``arange(a, b)``, across block edges and up to the domain's end, asked in any order."""
    perm = KeyedPermutation(n, np.array(keys, dtype=np.uint64))
    a, b = sorted(min(v, n) for v in bounds)
    b = max(b, a + 1) if a < n else n
    for start, stop in ((a, b), (0, min(n, BLOCK + 1)), (a, b), (max(0, n - 5), n)):
        if start < stop:
            want = perm(np.arange(start, stop, dtype=np.int64))
            assert np.array_equal(perm.images(start, stop), want)
    assert len(perm._blocks) <= 2


def test_scattered_positions_near_or_far_give_the_orders_ids():
    """Positions spread over a window (slot ids from the kept blocks) and over the whole epoch
    (slot ids evaluated one by one) give the ids of the epoch's whole order."""
    cfg = PlanConfig(counts=(50_000, 33_333, 7), batch_size=1, span=3, seed=5)
    whole = epoch_order(cfg, 2)
    order = order_of(cfg, 2)
    rng = np.random.default_rng(0)
    for width in (500, 20_000, order.size):
        start = int(rng.integers(0, order.size - width + 1))
        pos = rng.permutation(np.arange(start, start + width))[: max(1, width // 9)]
        assert np.array_equal(order.take(pos), whole[pos])


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 60), min_size=1, max_size=20).map(tuple),
    span=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_order_at_some_positions_equals_the_whole_order_there(counts, span, seed, data):
    cfg = PlanConfig(counts=counts, batch_size=1, span=span, seed=seed)
    whole = epoch_order(cfg, 3)
    n = whole.size
    pos = np.array(data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=30)), np.int64)
    pos = pos[pos < n]
    assert np.array_equal(order_of(cfg, 3).take(pos), whole[pos])


def test_the_order_holds_nothing_proportional_to_the_samples():
    def held(order: EpochOrder) -> int:
        arrays = (order.first_span, order.first_id, order.short_end, order.deficit)
        return sum(a.nbytes for a in arrays)

    rng = np.random.default_rng(0)
    small = tuple(int(c) for c in rng.integers(50, 150, 2000))
    big = tuple(c * 100_003 for c in small)  # 10^4 times the samples (2 * 10^10), same shards
    a = order_of(PlanConfig(counts=small, batch_size=1, span=27), 0)
    b = order_of(PlanConfig(counts=big, batch_size=1, span=27), 0)
    assert b.size == 100_003 * a.size > 2 * 10**10
    assert held(b) <= held(a) + 8 and held(b) < 2000 * 4 * 8 + 8
    ids = b.take(np.arange(5 * 10**9, 5 * 10**9 + 1000, dtype=np.int64))
    assert ids.dtype == np.int64 and np.unique(ids).size == 1000
    assert ids.min() >= 0 and ids.max() < b.size


@st.composite
def large_world(draw, world=None):
    """A config for up to 512 ranks over a few thousand samples."""
    world = draw(st.integers(1, 512)) if world is None else world
    batch = draw(st.integers(1, 4))
    shards = draw(st.integers(1, 12))
    total = draw(st.integers(world * batch, world * batch * 6))  # 1-6 batches per rank
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=shards - 1, max_size=shards - 1)))
    counts = tuple(np.diff([0, *cuts, total]).tolist())
    return PlanConfig(
        counts=counts,
        batch_size=batch,
        world_size=world,
        num_workers=draw(st.integers(1, 8)),
        seed=draw(st.integers(0, 2**32 - 1)),
        span=draw(st.integers(1, 6)),
        window=draw(st.sampled_from([0, 3, 16])),
        drop_last=draw(st.booleans()),
    )


def all_ranks(cfg: PlanConfig, resume: Resume | None = None) -> list[list[np.ndarray]]:
    return [rank_batches(cfg, 0, r, resume) for r in range(cfg.world_size)]


@FEW
@given(cfg=large_world())
def test_every_rank_steps_equally_and_every_sample_comes_once(cfg):
    ranks = all_ranks(cfg)
    nb = num_batches(cfg)
    assert nb >= 1
    assert {len(b) for b in ranks} == {nb}
    assert len({tuple(len(x) for x in b) for b in ranks}) == 1  # equal batch sizes on all ranks
    got = flat([x for b in ranks for x in b])
    n = cfg.num_samples
    if cfg.drop_last:
        assert np.unique(got).size == got.size == n - epoch_dropped(cfg)
    else:
        assert np.array_equal(np.unique(got), np.arange(n))
        assert got.size == cfg.world_size * -(-n // cfg.world_size)


@FEW
@given(cfg=large_world(), data=st.data())
def test_resume_equals_the_uninterrupted_run_on_any_rank(cfg, data):
    nb = num_batches(cfg)
    k = data.draw(st.integers(0, nb))
    for r in sorted({0, cfg.world_size - 1, data.draw(st.integers(0, cfg.world_size - 1))}):
        full = rank_batches(cfg, 0, r)
        resumed = rank_batches(cfg, 0, r, Resume(cfg, k))
        assert [x.tolist() for x in resumed] == [x.tolist() for x in full[k:]]
        w = data.draw(st.integers(0, cfg.num_workers - 1))
        lazy = worker_batches(cfg, 0, r, w, Resume(cfg, k))
        assert [x.tolist() for x in lazy] == [x.tolist() for x in lazy[:]]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=large_world(world=512), data=st.data())
def test_elastic_resume_from_512_to_384_ranks_delivers_the_rest_once(old, data):
    new = PlanConfig(
        counts=old.counts,
        batch_size=data.draw(st.integers(1, 4)),
        world_size=384,
        num_workers=data.draw(st.integers(1, 8)),
        seed=old.seed,
        span=old.span,
        window=data.draw(st.sampled_from([0, 5, 16])),
        drop_last=True,
    )
    k = data.draw(st.integers(0, num_batches(old)))
    state = Resume(old, k)
    consumed = flat([x for b in all_ranks(old) for x in b[:k]])
    rest = all_ranks(new, state)
    assert len({len(b) for b in rest}) == 1 and {len(x) for b in rest for x in b} <= {
        new.batch_size
    }
    delivered = flat([x for b in rest for x in b])
    both = np.concatenate([consumed, delivered])
    dropped = epoch_dropped(new, resume=state)
    if old.drop_last:
        assert np.unique(both).size == both.size  # nothing twice
    else:  # the old plan's padding repeats a few samples: still none is delivered after resume
        assert not np.isin(delivered, consumed).any()
    assert np.unique(both).size + dropped == old.num_samples


def test_elastic_replan_holds_a_few_pieces_per_worker_not_the_consumed_samples():
    from wdsloader.plan.resume import Remaining, resolve

    counts = tuple([1000] * 800)  # 800,000 samples, 512 ranks x 8 workers, windows of 96
    old = PlanConfig(counts=counts, batch_size=8, world_size=512, num_workers=8, span=4, window=96)
    new = PlanConfig(counts=counts, batch_size=8, world_size=384, num_workers=8, span=4, window=96)
    k = 37  # every worker stands inside a window: 4 or 5 of its batches done, 12 per window
    base, _, skip = resolve(new, 0, Resume(old, k))
    assert isinstance(base, Remaining) and skip == 0
    assert len(base.leftovers) == 512 * 8 and base.cum.size <= 3 * 512 * 8 + 2
    assert base.size == 800_000 - 512 * k * 8
    first = worker_batches(new, 0, 0, 0, Resume(old, k))[0]
    consumed = flat([x for r in (0, 255, 511) for x in rank_batches(old, 0, r)[:k]])
    assert first.size == 8 and not np.isin(first, consumed).any()


def test_shuffle_quality_holds_over_seeds():
    """The keyed order is as good as a uniform permutation of spans on the quality benchmark's
    split (bench/experiments/shuffle_quality.py): small |rho| for every seed, consecutive distance ~ N/3."""
    from scipy.stats import spearmanr

    rhos, dists = [], []
    for seed in range(8):
        cfg = PlanConfig(counts=(2000,) * 50, batch_size=256, span=24, window=16384, seed=seed)
        stream = flat(rank_batches(cfg, 0, 0))
        rhos.append(abs(spearmanr(stream, np.arange(stream.size)).statistic))
        dists.append(np.abs(np.diff(stream)).mean() / 100_000)
    assert max(rhos) < 0.05 and np.mean(rhos) < 0.025
    assert 0.32 < min(dists) and max(dists) < 0.345
