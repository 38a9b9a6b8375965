"""The mix plan (wdsloader.plan.mix) against brute-force references: exact quotas, selection that
repeats no sample before its source is used up, the two batchings, every rank equal, resume."""

from __future__ import annotations

import math
import pickle
from collections import Counter
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdsloader.curriculum import cosine, fixed, from_callable, linear, steps
from wdsloader.mix import MixSource, MixSpec, mix_epoch, mix_quotas_for
from wdsloader.mix import source as source_module
from wdsloader.mix.source import epoch_offsets_for
from wdsloader.plan import PlanConfig, Resume
from wdsloader.plan.mix import (
    MixEpoch,
    MixTopology,
    _key,
    _permute,
    mix_num_batches,
    mix_plan_config,
    mix_rank_batches,
    mix_worker_batches,
    mixed_layout,
    source_ids,
)
from wdsloader.plan.quotas import mix_quotas

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_lr(weights, total):
    """Hamilton's method, written out: floors, then the largest remainders (ties: lower index)."""
    w = [Fraction(repr(float(x))) for x in weights]
    exact = [x * total / sum(w) for x in w]
    floors = [math.floor(e) for e in exact]
    ranked = sorted(range(len(w)), key=lambda i: (floors[i] - exact[i], i))
    for i in ranked[: total - sum(floors)]:
        floors[i] += 1
    return floors


def pairs(batches):
    srcs = np.concatenate([s for s, _ in batches]).tolist()
    ids = np.concatenate([i for _, i in batches]).tolist()
    return Counter(zip(srcs, ids, strict=True))


def epoch_multiset(me: MixEpoch):
    src, ids = mixed_layout(me, np.arange(me.length))
    return Counter(zip(src.tolist(), ids.tolist(), strict=True))


sources_st = st.lists(st.integers(1, 25), min_size=1, max_size=4)


# ----------------------------------------------------------------------------------- quotas


@FAST
@given(
    sizes=sources_st,
    data=st.data(),
    epoch_samples=st.one_of(st.none(), st.integers(0, 200)),
)
def test_quotas_are_the_largest_remainder_of_the_weights(sizes, data, epoch_samples):
    n = len(sizes)
    fixed = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=n, max_size=n))
    weights = [
        data.draw(st.floats(0.01, 10).map(lambda x: round(x, 3))) if f is None else None
        for f in fixed
    ]
    weighted = [i for i in range(n) if fixed[i] is None]
    fixed_sum = sum(f for f in fixed if f is not None)
    left = sum(sizes[i] for i in weighted) if epoch_samples is None else epoch_samples - fixed_sum
    if weighted and left < 0:
        with pytest.raises(ValueError, match=r"is less than the \d+ samples the sources with"):
            mix_quotas(sizes, weights, fixed, epoch_samples)
        return
    if not weighted and epoch_samples is not None and left != 0:
        with pytest.raises(ValueError, match=r"differs from the \d+ samples the sources take"):
            mix_quotas(sizes, weights, fixed, epoch_samples)
        return
    q = mix_quotas(sizes, weights, fixed, epoch_samples).tolist()
    for i in range(n):
        if fixed[i] is not None:
            assert q[i] == fixed[i]
    if weighted:
        assert [q[i] for i in weighted] == reference_lr([weights[i] for i in weighted], left)
        assert sum(q) == (fixed_sum + left)


def test_source_forms_and_their_quotas():
    sizes = [1000, 50, 7]
    web, code, tiny = (
        MixSource("s3://b/web/", weight=0.7),
        MixSource("./code", repeat=3),
        MixSource("t"),
    )
    assert web.name == "web" and code.name == "code"
    two = [MixSource("a", weight=0.7), MixSource("b", weight=0.3)]
    assert mix_quotas_for(two, [10, 10], 0) == (14, 6)  # SUM of the weighted sizes, 0.7/0.3 of it
    five = MixSource("t", samples=5)
    assert mix_quotas_for([web, code, five], sizes, 0, epoch_samples=505) == (350, 150, 5)
    assert mix_quotas_for([MixSource("a"), MixSource("b")], [3, 4], 0) == (3, 4)  # each once
    rep = [MixSource("a", repeat=0.25), MixSource("b", repeat=2.5)]
    assert mix_quotas_for(rep, [10, 3], 0) == (2, 7)
    with pytest.raises(ValueError, match=r"give one of weight=, samples= or repeat=, not"):
        MixSource("a", weight=1, samples=3)
    with pytest.raises(ValueError, match=r"weight=-1 must be finite, >= 0"):
        MixSource("a", weight=-1)
    with pytest.raises(ValueError, match=r"sources share the names \['x'\]"):
        mix_quotas_for([MixSource("a/x"), MixSource("b/x")], [1, 1], 0)
    with pytest.raises(ValueError, match=r"sources \['t'\] have no weight=, samples= or repeat="):
        mix_quotas_for([web, tiny], sizes[:2], 0)
    with pytest.raises(ValueError, match=r"sources \['web'\] have a weight= and the mix a weights"):
        mix_quotas_for([web, code], sizes[:2], 0, weights=steps({0: {"web": 1.0}}))
    with pytest.raises(ValueError, match=r"sources \['b'\] have no samples but a quota of \[3\]"):
        mix_quotas_for([MixSource("a", weight=1), MixSource("b", samples=3)], [4, 0], 0)
    with pytest.raises(
        ValueError,
        match=r"^sources \['b', 'c'\] have no samples in split 'val' but a quota of \[2, 5\] "
        r"samples per epoch: leave them out of this split's mix$",
    ):
        sources = [MixSource("a", weight=1), MixSource("b", weight=1), MixSource("c", samples=5)]
        mix_quotas_for(sources, [4, 0, 0], 0, split="val")


def test_counts_past_int64_name_the_source_or_the_split():
    with pytest.raises(
        ValueError, match=r"^MixSource 'x/a': samples must be <= 9223372036854775807"
    ):
        MixSource("x/a", samples=2**63)
    half = 2**62  # each fits int64, two of them do not
    with pytest.raises(
        ValueError,
        match=r"^the epoch of split 'train' would hold 9223372036854775808 samples, more than an "
        r"int64 holds \(9223372036854775807\): samples per source \{'a': 4611686018427387904, "
        r"'b': 4611686018427387904\}$",
    ):
        mix_quotas_for(
            [MixSource("a", samples=half), MixSource("b", samples=half)], [1, 1], 0, split="train"
        )
    with pytest.raises(ValueError, match=r"epoch would hold 9223372036854775808 samples.*'a': 46"):
        mix_quotas_for([MixSource("a", weight=1.0), MixSource("b", repeat=1)], [half, half], 0)
    with pytest.raises(ValueError, match=r"^epoch_samples must be <= 9223372036854775807"):
        mix_quotas_for([MixSource("a", weight=1.0)], [5], 0, epoch_samples=2**63)
    with pytest.raises(
        ValueError,
        match=r"^the sources hold 9223372036854775808 samples in split 'train', more than an int64 "
        r"holds \(9223372036854775807\): \{'a': 4611686018427387904, 'b': 4611686018427387904\}$",
    ):
        sources = (MixSource("a", weight=1.0), MixSource("b", weight=1.0))
        MixSpec(sources=sources, sizes=(half, half), shards=(1, 1), epoch_samples=10, split="train")
    with pytest.raises(ValueError, match=r"^counts sum to 9223372036854775808 samples, more than"):
        PlanConfig(counts=(half, half), batch_size=1)


def test_a_mix_at_an_epoch_near_the_int64_limit_plans_its_batches():
    # the streams' positions pass int64 there; a stream cycles through its source, so only
    # the position modulo the source's size matters
    sources, sizes = schedule_mix("constant"), (100, 37, 5)
    far = mix_epoch(sources, sizes, 2**62, seed=3, block=4)
    assert far.offsets[0] > 2**63
    near = replace(far, offsets=tuple(o % n for o, n in zip(far.offsets, sizes, strict=True)))
    topo = MixTopology(batch_size=8, num_workers=2)
    got, expected = mix_rank_batches(far, topo, 0), mix_rank_batches(near, topo, 0)
    assert len(got) == len(expected) > 0
    for (s1, i1), (s2, i2) in zip(got, expected, strict=True):
        assert s1.tolist() == s2.tolist() and i1.tolist() == i2.tolist()


def test_a_weight_schedule_gives_each_epoch_its_quotas_and_streams_continue():
    sources = [MixSource("web"), MixSource("code"), MixSource("tiny", samples=4)]
    sizes = [100, 10, 3]
    sched = linear({"web": 0.9, "code": 0.1}, {"web": 0.5, "code": 0.5}, epochs=2)
    plans = [mix_epoch(sources, sizes, e, weights=sched, seed=5) for e in range(4)]
    assert [p.quotas for p in plans] == [(99, 11, 4), (77, 33, 4), (55, 55, 4), (55, 55, 4)]
    assert [p.offsets for p in plans] == [(0, 0, 0), (99, 11, 4), (176, 44, 8), (231, 99, 12)]
    # a process that starts at epoch 3 (a resume after the weights changed) plans what an
    # uninterrupted run plays: each source's stream continues exactly where epoch 2 stopped
    for s, n in enumerate(sizes):
        keys = _key(5, s, 0x5043_5EED)
        played = np.concatenate(
            [source_ids(n, 1, keys, p.offsets[s] + np.arange(p.quotas[s])) for p in plans]
        )
        cycle = source_ids(n, 1, keys, np.arange(n))
        assert played.tolist() == [cycle[t % n] for t in range(played.size)]


# ------------------------------------------------------------------- offsets at far epochs


def reference_offsets(sources, sizes, epochs: int, **kw) -> list[tuple[int, ...]]:
    """The streams' positions at epochs ``0 .. epochs - 1``: every earlier epoch's quotas summed
    (what mix_epoch once did at every epoch)."""
    out, sums = [], (0,) * len(sources)
    for e in range(epochs):
        out.append(sums)
        sums = tuple(
            a + b for a, b in zip(sums, mix_quotas_for(sources, sizes, e, **kw), strict=True)
        )
    return out


def weights_by_epoch(epoch: int) -> dict[str, float]:
    """A schedule from a function, different at every epoch (module level: picklable)."""
    a = (1 + (epoch * 7) % 5) / 8
    return {"a": a, "b": 1 - a}


SCHEDULES = {
    "constant": None,  # the sources' own weights
    "fixed": fixed({"a": 0.3, "b": 0.7}),
    "linear": linear({"a": 0.9, "b": 0.1}, {"a": 0.2, "b": 0.8}, epochs=17),
    "cosine": cosine({"a": 0.6, "b": 0.4}, {"a": 0.1, "b": 0.9}, epochs=30),
    "steps": steps({0: {"a": 0.5, "b": 0.5}, 5: {"a": 0.2, "b": 0.8}, 23: {"a": 1.0, "b": 0.0}}),
    "callable": from_callable(weights_by_epoch),
}


def schedule_mix(kind: str) -> list[MixSource]:
    if SCHEDULES[kind] is None:
        return [MixSource("a", weight=1.0), MixSource("b", weight=2.3), MixSource("c", samples=5)]
    return [MixSource("a"), MixSource("b"), MixSource("c", repeat=1.5)]


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(sorted(SCHEDULES)),
    sizes=st.lists(st.integers(1, 40), min_size=3, max_size=3),
    epoch_samples=st.one_of(st.none(), st.integers(90, 200)),
    every=st.integers(1, 8),
    order=st.permutations(range(51)),
)
def test_offsets_equal_the_sum_of_every_earlier_epochs_quotas(
    kind, sizes, epoch_samples, every, order
):
    sources, kw = schedule_mix(kind), {"weights": SCHEDULES[kind], "epoch_samples": epoch_samples}
    expected = reference_offsets(sources, sizes, 51, **kw)
    offsets = epoch_offsets_for(sources, sizes, **kw)
    offsets.every = every  # sums kept every few epochs: reached from both sides below
    for e in order:  # in any order: a run goes forward, a resume anywhere
        me = mix_epoch(sources, sizes, e, seed=3, offsets=offsets, **kw)
        assert me.offsets == expected[e], e
        assert me.quotas == mix_quotas_for(sources, sizes, e, **kw)
        if e % 10 == 0:  # without kept sums: the same
            assert me == mix_epoch(sources, sizes, e, seed=3, **kw)


@pytest.fixture
def quota_calls(monkeypatch) -> list[int]:
    """Counts the quota computations of every epoch (one per mix_quotas_for call)."""
    calls: list[int] = []
    real = source_module.mix_quotas

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(source_module, "mix_quotas", counted)
    return calls


def test_a_far_epoch_costs_a_few_quota_computations(quota_calls):
    far = 10**6  # the sum over every earlier epoch took 30 s at 10^5
    sizes = [100, 37, 5]
    sources = schedule_mix("constant")
    spec = MixSpec(sources=tuple(sources), sizes=tuple(sizes), shards=(1, 1, 1))
    quota_calls.clear()
    me = spec.epoch(far, seed=3, block=4)
    first = mix_worker_batches(me, MixTopology(batch_size=8, num_workers=2), 0, 0)[0]
    assert len(quota_calls) <= 3 and first[0].size == 8
    assert me.offsets == tuple(far * q for q in mix_quotas_for(sources, sizes, 0))
    # a schedule: the epochs before its end summed, then its last quotas times the rest
    sources, sched = schedule_mix("linear"), SCHEDULES["linear"]
    quota_calls.clear()
    me = mix_epoch(sources, sizes, far, weights=sched)
    assert len(quota_calls) <= 17 + 3
    before_end = reference_offsets(sources, sizes, 18, weights=sched)[17]
    last = mix_quotas_for(sources, sizes, 17, weights=sched)
    assert me.offsets == tuple(a + (far - 17) * q for a, q in zip(before_end, last, strict=True))


def test_a_run_of_epochs_adds_one_epochs_quotas_at_a_time(quota_calls):
    # a schedule from a function never settles: the mix keeps its sums from epoch to epoch
    # (and sends them to spawned workers) instead of summing every earlier epoch again
    sources, sched = schedule_mix("callable"), SCHEDULES["callable"]
    spec = MixSpec(sources=tuple(sources), sizes=(30, 20, 10), shards=(1, 1, 1), weights=sched)
    quota_calls.clear()
    plans = [spec.epoch(e) for e in range(300)]
    assert len(quota_calls) <= 2 * 300  # the epoch's own quotas, and one more epoch summed
    expected = reference_offsets(sources, (30, 20, 10), 300, weights=sched)
    assert [p.offsets for p in plans] == expected
    sent = pickle.loads(pickle.dumps(spec))
    quota_calls.clear()
    assert sent.epoch(299) == plans[299] and len(quota_calls) <= 2


# -------------------------------------------------------------------------------- selection


@FAST
@given(
    size=st.integers(1, 40),
    block=st.integers(1, 6),
    quotas=st.lists(st.integers(0, 90), min_size=1, max_size=6),
    seed=st.integers(0, 3),
)
def test_selection_repeats_no_sample_before_its_source_is_used_up(size, block, quotas, seed):
    keys = _key(seed, 0, 0x5043_5EED)
    cycle = source_ids(size, block, keys, np.arange(size)).tolist()
    assert sorted(cycle) == list(range(size))  # one pass holds every sample once
    # blocks of `block` consecutive ids stay together (the short block ends the pass)
    starts = [cycle[i] for i in range(0, size - size % block, block)]
    for i, a in enumerate(starts):
        assert cycle[i * block : (i + 1) * block] == list(range(a, a + block))
    offset = 0
    for q in quotas:
        ids = source_ids(size, block, keys, offset + np.arange(q)).tolist()
        assert ids == [cycle[(offset + t) % size] for t in range(q)]  # the stream, continued
        counts = Counter(ids)
        k = q // size
        assert sum(counts.values()) == q
        assert all(counts[i] in (k, k + 1) for i in range(size))  # each k or k+1 times
        assert len(set(ids[:size])) == min(q, size)  # no repeat before all were used
        if q == size:
            assert sorted(ids) == list(range(size))  # exactly once
        offset += q


def test_the_source_order_permutation_depends_on_the_key():
    for n in (1, 2, 3, 7, 64, 1000, 4099):
        perm = _permute(n, _key(1, n), np.arange(n))
        assert sorted(perm.tolist()) == list(range(n))
    a = _permute(1000, _key(1), np.arange(1000))
    assert a.tolist() != _permute(1000, _key(2), np.arange(1000)).tolist()
    assert a.tolist() == _permute(1000, _key(1), np.arange(1000)).tolist()


# ------------------------------------------------------------------------------------ order


@st.composite
def mix_epochs(draw, max_quota=60):
    sizes = draw(sources_st)
    quotas = draw(st.lists(st.integers(0, max_quota), min_size=len(sizes), max_size=len(sizes)))
    offsets = draw(st.lists(st.integers(0, 100), min_size=len(sizes), max_size=len(sizes)))
    return MixEpoch(
        sizes=tuple(sizes), quotas=tuple(quotas), offsets=tuple(offsets),
        seed=draw(st.integers(0, 5)), epoch=draw(st.integers(0, 5)), block=draw(st.integers(1, 5)),
    )  # fmt: skip


@FAST
@given(me=mix_epochs(), data=st.data())
def test_mixed_layout_matches_the_materialised_reference(me, data):
    b = me.block
    # reference: every source's epoch samples in stream order, cut into blocks; short blocks
    # first in source order, then the whole blocks in the keyed order
    per_source = [
        source_ids(n, b, _key(me.seed, s, 0x5043_5EED), me.offsets[s] + np.arange(q)).tolist()
        for s, (n, q) in enumerate(zip(me.sizes, me.quotas, strict=True))
    ]
    short = [(s, x) for s, ids in enumerate(per_source) for x in ids[len(ids) - len(ids) % b :]]
    whole = [
        [(s, x) for x in ids[i : i + b]]
        for s, ids in enumerate(per_source)
        for i in range(0, len(ids) - len(ids) % b, b)
    ]
    order = _permute(len(whole), _key(me.seed, me.epoch, 0xB10C_5EED), np.arange(len(whole)))
    reference = short + [p for i in order.tolist() for p in whole[i]]
    src, ids = mixed_layout(me, np.arange(me.length))
    assert list(zip(src.tolist(), ids.tolist(), strict=True)) == reference
    # any positions, in any order, one at a time: the same answer (no global state)
    if me.length:
        pos = data.draw(st.lists(st.integers(0, me.length - 1), min_size=1, max_size=8))
        s1, i1 = mixed_layout(me, np.asarray(pos))
        assert list(zip(s1.tolist(), i1.tolist(), strict=True)) == [reference[p] for p in pos]


@FAST
@given(
    me=mix_epochs(max_quota=40),
    world=st.integers(1, 8),
    workers=st.integers(0, 3),
    batch=st.integers(1, 5),
    drop_last=st.booleans(),
    batching=st.sampled_from(["mixed", "stratified"]),
    window=st.integers(0, 7),
)
def test_every_rank_yields_the_same_batches_and_the_epoch_is_delivered(
    me, world, workers, batch, drop_last, batching, window
):
    topo = MixTopology(batch_size=batch, world_size=world, num_workers=max(workers, 1),
                       drop_last=drop_last, window=window, batching=batching)  # fmt: skip
    n = mix_num_batches(me, topo)
    ranks = [mix_rank_batches(me, topo, r) for r in range(world)]
    assert [len(r) for r in ranks] == [n] * world  # equal on every rank
    g = world * batch
    if drop_last:
        assert n == me.length // g
        assert all(src.size == batch for rank in ranks for src, _ in rank)
    elif batching == "stratified":
        assert n == -(-me.length // g)
    else:
        per_rank = -(-me.length // world)
        assert n == -(-per_rank // batch)
    got = sum((pairs(r) for r in ranks if r), Counter())
    want = epoch_multiset(me)
    delivered = sum(got.values())
    if drop_last:  # fewer than one global batch left out, nothing added
        assert not got - want and me.length - delivered < g
    else:  # everything, plus fewer than `world` repeats to pad the last batches
        assert not want - got and delivered - me.length < world
    if me.length % g == 0:
        assert got == want  # nothing left out, nothing repeated
    if me.quotas == me.sizes:  # weights that allow it: every sample of every source once
        assert want == Counter((s, i) for s, n in enumerate(me.sizes) for i in range(n))


@FAST
@given(
    me=mix_epochs(max_quota=40),
    world=st.integers(1, 4),
    batch=st.integers(1, 6),
    drop_last=st.booleans(),
)
def test_stratified_global_batches_hold_each_sources_exact_share(me, world, batch, drop_last):
    topo = MixTopology(batch_size=batch, world_size=world, drop_last=drop_last,
                       batching="stratified")  # fmt: skip
    ranks = [mix_rank_batches(me, topo, r) for r in range(world)]
    g, q = world * batch, np.asarray(me.quotas)
    full, last = divmod(me.length, g)
    tail = np.zeros_like(q)
    if last:  # the last (short) global batch: the largest-remainder share of its samples
        tail = np.asarray(reference_lr(q, last) if q.sum() else tail)
    body = q - tail
    totals = np.zeros_like(q)
    for t in range(full):
        counts = sum(np.bincount(ranks[r][t][0], minlength=q.size) for r in range(world))
        assert counts.sum() == g
        assert np.all((counts == body // full) | (counts == body // full + 1))  # floor or ceil
        totals += counts
    assert totals.tolist() == body.tolist()  # the remainders rotate: the quotas hold
    if last and not drop_last:
        real = Counter()
        for r in range(world):
            src, ids = ranks[r][full]
            real.update(zip(src.tolist(), ids.tolist(), strict=True))
        assert {s for s, _ in real} <= {s for s in range(q.size) if tail[s]}
    # the samples of a source are its epoch samples: the multiset over the full batches is
    # exactly its stream's first body[s] epoch positions
    for s in range(q.size):
        got = Counter(
            x for r in range(world) for src, ids in ranks[r][:full] for x in ids[src == s].tolist()
        )
        keys = _key(me.seed, s, 0x5043_5EED)
        ref = source_ids(me.sizes[s], me.block, keys, me.offsets[s] + np.arange(body[s]))
        assert got == Counter(ref.tolist())


@FAST
@given(
    me=mix_epochs(max_quota=40),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    batch=st.integers(1, 4),
    batching=st.sampled_from(["mixed", "stratified"]),
    data=st.data(),
)
def test_resuming_after_k_batches_yields_exactly_the_rest(
    me, world, workers, batch, batching, data
):
    topo = MixTopology(batch_size=batch, world_size=world, num_workers=workers, window=3,
                       batching=batching, drop_last=False)  # fmt: skip
    n = mix_num_batches(me, topo)
    k = data.draw(st.integers(0, n))
    for rank in range(world):
        full = mix_rank_batches(me, topo, rank)
        resume = Resume(mix_plan_config(me, topo), k) if k else None
        lists = [mix_worker_batches(me, topo, rank, i, resume) for i in range(workers)]
        longest = max(len(x) for x in lists)
        rest = [lst[j] for j in range(longest) for lst in lists if j < len(lst)]
        assert [(s.tolist(), i.tolist()) for s, i in rest] == [
            (s.tolist(), i.tolist()) for s, i in full[k:]
        ]


def test_mixed_batches_mix_the_sources_and_depend_on_seed_and_epoch():
    me = MixEpoch(sizes=(600, 300, 100), quotas=(600, 300, 100), offsets=(0, 0, 0), block=4)
    topo = MixTopology(batch_size=50, window=200)
    batches = mix_rank_batches(me, topo, 0)
    assert len(batches) == 20
    shares = np.mean([np.bincount(s, minlength=3) for s, _ in batches], axis=0) / 50
    assert np.allclose(shares, [0.6, 0.3, 0.1])
    assert sum(len(set(s.tolist())) == 3 for s, _ in batches) >= 15  # most batches hold all 3
    other = MixEpoch(sizes=me.sizes, quotas=me.quotas, offsets=me.offsets, block=4, epoch=1)
    assert mix_rank_batches(other, topo, 0)[0][1].tolist() != batches[0][1].tolist()
    assert mix_rank_batches(me, topo, 0)[0][1].tolist() == batches[0][1].tolist()


def test_topology_and_epoch_errors():
    with pytest.raises(ValueError, match=r"batching must be 'mixed' or 'stratified', got 'x'"):
        MixTopology(batch_size=2, batching="x")
    with pytest.raises(ValueError, match=r"need one entry per source, got 2, 1 and 2"):
        MixEpoch(sizes=(1, 2), quotas=(1,), offsets=(0, 0))
    with pytest.raises(ValueError, match=r"sources \[0\] have no samples but a quota"):
        MixEpoch(sizes=(0, 2), quotas=(1, 1), offsets=(0, 0))
    me = MixEpoch(sizes=(4,), quotas=(4,), offsets=(0,))
    with pytest.raises(ValueError, match=r"rank"):
        mix_worker_batches(me, MixTopology(batch_size=2, world_size=2), rank=2, worker=0)


def test_one_source_and_one_batch_old_names_warn():
    """``Source`` is the build input adapter only, ``Batch`` the training batch only: the mix's
    ``Source`` is ``MixSource`` and the mix plan's ``Batch`` is ``MixBatchIds``; their old names
    resolve until 0.2.0 with a DeprecationWarning naming the new import."""
    import build_shards
    import wdsloader
    import wdsloader.mix.source
    import wdsloader.plan.mix
    from build_shards.sources.base import Source as BuildInput
    from wdsloader.plan.mix import MixBatchIds

    assert "MixSource" in wdsloader.__all__ and "Source" not in wdsloader.__all__
    new = r"`from wdsloader.mix import MixSource`"
    for module in (wdsloader.mix, wdsloader.mix.source):
        with pytest.warns(
            DeprecationWarning, match=rf"{module.__name__}.Source is deprecated.*{new}"
        ):
            assert module.Source is MixSource
    with pytest.warns(DeprecationWarning, match=r"`from wdsloader import MixSource`"):
        assert wdsloader.Source is MixSource
    with pytest.warns(DeprecationWarning, match=r"`from wdsloader.plan.mix import MixBatchIds`"):
        assert wdsloader.plan.mix.Batch is MixBatchIds
    assert build_shards.Source is BuildInput and wdsloader.Batch == dict[str, Any]
