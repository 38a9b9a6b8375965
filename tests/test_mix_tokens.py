"""Token-weighted mixing (``Mix(unit="tokens")``): each source's tokens per epoch are its quota
within one document (never accumulating over epochs), no document twice within a source's
quota, and the epoch in documents is dealt like any mix: equal batches on every rank, exact
and elastic resume."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from build_shards import SampleOptions, ShardOptions, build_shards
from wdsloader import DecodeOptions, create_loader
from wdsloader.curriculum import linear
from wdsloader.mix import Mix, MixSource, MixSpec
from wdsloader.mix.tokens import TokenPlan
from wdsloader.plan import Resume
from wdsloader.plan.mix import (
    MixTopology,
    mix_num_batches,
    mix_plan_config,
    mix_rank_batches,
    mix_worker_batches,
    mixed_layout,
)
from wdsloader.plan.mix_stream import _SOURCE_TAG, _key, source_ids
from wdsloader.plan.quotas import largest_remainder
from wdsloader.plan.tokens import TokenStream

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

lengths_st = st.lists(st.integers(0, 60), min_size=1, max_size=30).filter(lambda x: sum(x) > 0)


@FAST
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=30),
    seed=st.integers(0, 3),
    block=st.integers(1, 4),
    data=st.data(),
)
def test_a_token_stream_counts_the_tokens_of_its_sources_stream(lengths, seed, block, data):
    stream = TokenStream(np.asarray(lengths, np.uint32), seed=seed, source=1, block=block)
    n = len(lengths)
    order = source_ids(n, block, _key(seed, 1, _SOURCE_TAG), np.arange(3 * n))
    tokens = np.concatenate([[0], np.cumsum(np.asarray(lengths)[order])])
    assert [stream.tokens_before(p) for p in range(3 * n + 1)] == tokens.tolist()
    if sum(lengths) == 0:
        return
    t = data.draw(st.integers(0, 2 * sum(lengths)))
    p = stream.position_at(t)
    assert tokens[p] >= t  # the documents before p hold the first t tokens...
    assert p == 0 or tokens[p - 1] < t  # ...and the last of them starts before token t
    assert tokens[p] - t < max(lengths)  # so less than one document more


@st.composite
def token_plans(draw, max_sources=3):
    k = draw(st.integers(1, max_sources))
    lengths = [np.asarray(draw(lengths_st), np.uint32) for _ in range(k)]
    forms = draw(st.lists(st.sampled_from(["weight", "repeat"]), min_size=k, max_size=k))
    sources = []
    for i, form in enumerate(forms):
        value = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
        sources.append(MixSource(f"s{i}", name=f"s{i}", **{form: value}))
    fixed = sum(
        int(s.repeat * int(x.sum())) for s, x in zip(sources, lengths, strict=True) if s.repeat
    )
    epoch_tokens = draw(st.one_of(st.none(), st.integers(1, 3000).map(lambda t: t + fixed)))
    if all(f == "repeat" for f in forms):
        epoch_tokens = None
    return TokenPlan(sources, lengths, epoch_tokens=epoch_tokens)


@FAST
@given(plan=token_plans(), seed=st.integers(0, 5), block=st.integers(1, 3))
def test_each_sources_tokens_are_its_quota_within_one_document_every_epoch(plan, seed, block):
    streams = plan.streams(seed, block)
    total_target = [0] * len(plan.sources)
    prev = None
    for epoch in range(4):
        me = plan.epoch(epoch, seed=seed, block=block)
        quotas = plan.quotas(epoch)
        got = plan.epoch_tokens_of(me)
        src, ids = mixed_layout(me, np.arange(me.length))
        for s, lengths in enumerate(plan.lengths):
            longest = int(lengths.max())
            assert abs(got[s] - quotas[s]) < longest  # this epoch's tokens: within a document
            # and the documents of the epoch are those counted
            assert int(lengths[ids[src == s]].sum()) == got[s]
            total_target[s] += quotas[s]
            end = me.offsets[s] + me.quotas[s]
            assert 0 <= streams[s].tokens_before(end) - total_target[s] < longest  # no drift
            if quotas[s] <= plan.totals[s]:  # no document twice within the quota
                assert me.quotas[s] <= lengths.size
                assert len(set(ids[src == s].tolist())) == me.quotas[s]
        if prev is not None:  # the streams continue where the last epoch stopped
            assert me.offsets == tuple(
                a + q for a, q in zip(prev.offsets, prev.quotas, strict=True)
            )
        prev = me


def test_token_weights_split_the_epochs_tokens_not_its_documents():
    short = np.full(400, 10, np.uint32)  # many short documents
    long = np.full(40, 100, np.uint32)  # few long ones: the same 4000 tokens
    plan = TokenPlan(
        [MixSource("a", weight=3.0, name="short"), MixSource("b", weight=1.0, name="long")],
        [short, long], epoch_tokens=2000,
    )  # fmt: skip
    me = plan.epoch(0, seed=7, block=2)
    assert plan.quotas(0) == (1500, 500)
    assert plan.epoch_tokens_of(me) == (1500, 500)
    assert me.quotas == (150, 5)  # documents: 30x more of the short source, tokens 3x
    assert tuple(largest_remainder([3.0, 1.0], 2000)) == (1500, 500)


def _documents(batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Counter:
    """How often each (source, document) comes in batches of (sources, document ids)."""
    return Counter(
        (s, i) for src, ids in batches for s, i in zip(src.tolist(), ids.tolist(), strict=True)
    )


def _epoch_documents(me) -> Counter:
    """How often each (source, document) is in the mixed epoch ``me``."""
    src, ids = mixed_layout(me, np.arange(me.length))
    return Counter(zip(src.tolist(), ids.tolist(), strict=True))


@FAST
@given(
    plan=token_plans(),
    world=st.integers(1, 8),
    workers=st.integers(0, 3),
    batch=st.integers(1, 4),
    drop_last=st.booleans(),
    batching=st.sampled_from(["mixed", "stratified"]),
)
def test_every_rank_yields_the_same_batches_of_the_epochs_documents(
    plan, world, workers, batch, drop_last, batching
):
    me = plan.epoch(1, seed=3, block=2)
    topo = MixTopology(batch_size=batch, world_size=world, num_workers=max(workers, 1),
                       drop_last=drop_last, window=3, batching=batching)  # fmt: skip
    n = mix_num_batches(me, topo)
    ranks = [mix_rank_batches(me, topo, r) for r in range(world)]
    assert [len(r) for r in ranks] == [n] * world
    got = _documents(b for rank in ranks for b in rank)
    want = _epoch_documents(me)
    if drop_last:
        assert not got - want and me.length - got.total() < world * batch
    else:
        assert not want - got and got.total() - me.length < world


@FAST
@given(
    plan=token_plans(),
    before=st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4)),
    after=st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4)),
    data=st.data(),
)
def test_resume_is_exact_and_continues_elastically_on_another_topology(plan, before, after, data):
    me = plan.epoch(2, seed=1, block=1)

    def topo(world, workers, batch):
        return MixTopology(batch_size=batch, world_size=world, num_workers=workers, window=2,
                           drop_last=False)  # fmt: skip

    a, b = topo(*before), topo(*after)
    k = data.draw(st.integers(0, mix_num_batches(me, a)))
    resume = Resume(mix_plan_config(me, a), k) if k else None
    # exact: the same topology yields the batches after the k first
    for rank in range(a.world_size):
        full = mix_rank_batches(me, a, rank)
        rest = mix_rank_batches(me, a, rank, resume)
        assert [(s.tolist(), i.tolist()) for s, i in rest] == [
            (s.tolist(), i.tolist()) for s, i in full[k:]
        ]
    # elastic: another topology delivers the rest of the epoch's documents
    done = _documents(b for rank in range(a.world_size) for b in mix_rank_batches(me, a, rank)[:k])
    rest = [mix_rank_batches(me, b, r, resume) for r in range(b.world_size)]
    assert len({len(r) for r in rest}) == 1  # equal batches on every new rank
    later = _documents(b for rank in rest for b in rank)
    want = _epoch_documents(me)
    got = done + later
    assert not want - got  # every document of the epoch
    assert got.total() - me.length < a.world_size + b.world_size  # repeats: padding only
    assert [len(mix_worker_batches(me, b, 0, w, resume)) for w in range(b.num_workers)]


def test_a_weight_schedule_over_epochs_moves_the_token_shares():
    lengths = [np.arange(1, 101, dtype=np.uint32), np.full(300, 17, np.uint32)]
    sources = [MixSource("a", name="a"), MixSource("b", name="b")]
    plan = TokenPlan(
        sources, lengths, weights=linear({"a": 0.9, "b": 0.1}, {"a": 0.1, "b": 0.9}, epochs=4),
        epoch_tokens=5000,
    )  # fmt: skip
    shares = []
    for epoch in range(5):
        me = plan.epoch(epoch, seed=2, block=4)
        got = plan.epoch_tokens_of(me)
        assert all(abs(g - q) < 100 for g, q in zip(got, plan.quotas(epoch), strict=True))
        shares.append(got[0] / sum(got))
    assert shares[0] > 0.85 and shares[-1] < 0.15 and shares == sorted(shares, reverse=True)


def test_a_schedule_that_weights_a_source_without_tokens_later_is_refused_at_once():
    """The schedule's key epochs are checked when the plan is made (it raised at epoch 1,
    after a whole epoch of training)."""
    lengths = [np.arange(1, 11, dtype=np.uint32), np.zeros(4, np.uint32)]
    sources = [MixSource("a", name="a"), MixSource("b", name="b")]
    weights = linear({"a": 1.0, "b": 0.0}, {"a": 0.5, "b": 0.5}, epochs=4)
    with pytest.raises(ValueError, match=r"sources \['b'\] have no tokens \(every length is 0\)"):
        TokenPlan(sources, lengths, weights=weights)


A = MixSource("x/a", weight=1.0)


@pytest.mark.parametrize(
    ("sources", "options", "match"),
    [
        ([A], {"unit": "bytes"}, r"unit must be one of \['samples', 'tokens'\], got 'bytes'"),
        ([A], {"epoch_tokens": 10}, 'epoch_tokens counts tokens: give it with unit="tokens"'),
        ([A], {"unit": "tokens", "epoch_samples": 10}, "give epoch_tokens=, not epoch_samples="),
        (
            [A, MixSource("x/b", samples=3)],
            {"unit": "tokens"},
            r"sources \['b'\] have samples= \(a number of documents",
        ),
    ],
    ids=["unit", "epoch_tokens without tokens", "epoch_samples with tokens", "samples="],
)
def test_token_mix_options_are_checked(sources, options, match):
    with pytest.raises(ValueError, match=match):
        Mix(sources, **options)


def test_token_plan_and_spec_options_are_checked():
    with pytest.raises(ValueError, match=r"sources \['b'\] have no tokens \(every length is 0\)"):
        TokenPlan(
            [A, MixSource("x/b", weight=1.0)], [np.ones(3, np.uint32), np.zeros(2, np.uint32)]
        )
    with pytest.raises(ValueError, match="needs its sources' lengths"):
        MixSpec(sources=(A,), sizes=(3,), shards=(1,), unit="tokens")


# ------------------------------------------------------------------------ through the loader


def _docs(prefix: str, n: int, scale: int) -> list[dict]:
    return [
        {"__key__": f"{prefix}{i:04d}", "input_ids": np.zeros(_len(i, scale), np.int32), "i": i}
        for i in range(n)
    ]


def _len(i: int, scale: int) -> int:
    return ((i * 7919) % 13 + 1) * scale  # 1..13 x scale tokens, varied


@pytest.fixture(scope="module")
def token_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokmix")
    lengths = SampleOptions(lengths="input_ids")
    opts = dict(splits={"train": 1.0}, shards=ShardOptions(max_count=40))
    build_shards(_docs("a", 120, 2), root / "short", samples=lengths, **opts)
    build_shards(_docs("b", 60, 20), root / "long", samples=lengths, **opts)
    build_shards(_docs("c", 30, 3), root / "plain", **opts)
    return root


def _token_loader(root, **kw):
    mix = Mix(
        [MixSource(root / "short", weight=1.0), MixSource(root / "long", weight=1.0)],
        unit="tokens", epoch_tokens=3000, source_field="src",
    )  # fmt: skip
    return create_loader(mix, "train", 8, seed=5, decode=DecodeOptions(fields=["i"]), **kw)


def test_a_token_mix_through_the_loader_with_two_workers_gives_each_source_its_tokens(
    token_data,
):
    loader = _token_loader(token_data, num_workers=2, drop_last=False)
    for epoch in range(2):
        batches = list(loader)
        docs = [
            (s, i) for b in batches for s, i in zip(b["src"].tolist(), b["i"].tolist(), strict=True)
        ]
        me = loader.dataset_obj.mix.epoch(epoch, seed=5, block=loader.dataset_obj.config.span)
        real = Counter(docs)
        assert len(real) == me.length  # every document of the epoch...
        assert len(docs) - me.length < 8  # ...once, but for the padding of the last batch
        tokens: Counter = Counter()
        for s, i in real:
            tokens[s] += _len(i, (2, 20)[s])
        assert tokens != Counter() and set(tokens) == {0, 1}
        assert abs(tokens[0] - 1500) < 13 * 2 and abs(tokens[1] - 1500) < 13 * 20


def test_a_token_mix_resumes_exactly_mid_epoch(token_data):
    full = [b["i"].tolist() for b in _token_loader(token_data, num_workers=2)]
    first = _token_loader(token_data, num_workers=2)
    head = []
    for b in first:
        head.append(b["i"].tolist())
        if len(head) == 5:
            state = first.state_dict()
            break
    again = _token_loader(token_data, num_workers=2)
    again.load_state_dict(state)
    assert head + [b["i"].tolist() for b in again] == full


def test_a_source_without_lengths_is_refused_naming_it_and_adopt(token_data):
    mix = Mix(
        [MixSource(token_data / "short", weight=1.0), MixSource(token_data / "plain", weight=1.0)],
        unit="tokens",
    )
    with pytest.raises(ValueError) as err:
        create_loader(mix, "train", 4)
    assert str(err.value) == (
        "source 'plain': a mix of unit=\"tokens\" needs each document's length, and 1 of the 1 "
        "shards of split 'train' have none (first: train/train-00000-000.tar); add them with "
        f"`build-shards adopt {token_data / 'plain'} --lengths FIELD` (or build with "
        "SampleOptions(lengths=FIELD))"
    )


def test_a_token_mix_spec_pickles_to_workers_and_plans_the_same():
    import pickle

    lengths = (np.arange(1, 41, dtype=np.uint32), np.full(25, 9, np.uint32))
    spec = MixSpec(
        sources=(MixSource("x/a", weight=2.0), MixSource("x/b", weight=1.0)), sizes=(40, 25),
        shards=(1, 1), unit="tokens", epoch_tokens=600, lengths=lengths,
    )  # fmt: skip
    me = spec.epoch(3, seed=4, block=2)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy.epoch(3, seed=4, block=2) == me
    assert copy.fingerprint() == spec.fingerprint()
    other = MixSpec(
        sources=spec.sources, sizes=(40, 25), shards=(1, 1), unit="tokens", epoch_tokens=600,
        lengths=(lengths[0], np.full(25, 8, np.uint32)),
    )  # fmt: skip
    assert other.fingerprint() != spec.fingerprint()  # a state over other lengths is refused


def test_a_changed_lengths_file_is_refused_naming_the_source_shard_and_file(token_data, tmp_path):
    import shutil

    from wdsloader.errors import ShardFormatError
    from wdsloader.format import Manifest

    short = tmp_path / "short"
    shutil.copytree(token_data / "short", short)
    shard = Manifest.load(str(short)).split("train").shards[1]
    path = short / shard.lengths_path
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    mix = Mix([MixSource(short, weight=1.0), MixSource(token_data / "long", weight=1.0)],
              unit="tokens")  # fmt: skip
    with pytest.raises(ShardFormatError) as err:
        create_loader(mix, "train", 4)
    assert str(err.value).startswith(
        f"source 'short': shard {shard.path}: lengths {shard.lengths_path}: sha256 "
    )
    assert "differs from the manifest's" in str(err.value)


def test_the_replay_command_replays_a_token_mixs_steps(token_data, capsys):
    from wdsloader import ShardDataset
    from wdsloader.cli.commands import main

    names = ("short", "long")
    index = {}
    for name in names:
        ds = ShardDataset(token_data / name, fields=[])
        index[name] = {ds[i]["__key__"]: i for i in range(len(ds))}
    loader = _token_loader(token_data, num_workers=2)
    loader.set_epoch(1)
    want = []
    for b in loader:
        pairs = zip(b["src"].tolist(), b["__key__"], strict=True)
        want.append([f"{names[s]}\t{index[names[s]][k]}\t{k}" for s, k in pairs])
    argv = [str(token_data / n) for n in names]
    argv += ["--unit", "tokens", "--epoch-tokens", "3000", "--weights", "1,1", "--epoch", "1"]
    argv += ["--batch-size", "8", "--num-workers", "2", "--seed", "5"]
    for step in (0, len(want) - 1):
        assert main(["replay", *argv, "--step", str(step)]) == 0
        assert capsys.readouterr().out.splitlines() == want[step]
