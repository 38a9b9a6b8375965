"""A loader whose span was derived takes a loaded state's span: a remote checkpoint saved while
another span was the default resumes onto exactly the batches that followed it (also elastically,
with worker processes, thread workers and persistent workers); a span given explicitly that
differs from the state's is still refused."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from tests.test_loader import keys_of, run
from wdsloader import create_loader
from wdsloader.errors import StateMismatchError
from wdsloader.mix import MixSource
from wdsloader.stream import config as config_module
from wdsloader.stream.options import PlanOptions, Topology, WorkerOptions

COUNTS = [90, 70, 110, 60]  # 330 samples
OLD, NEW = 5, 16  # the span a remote plan derived when the state was saved, and now
_DERIVED = config_module.default_span_window


@pytest.fixture
def url(http_server):
    write_dataset(str(http_server.root / "ds"), {"train": COUNTS})
    return f"{http_server.url}/ds"


def derive(monkeypatch, span):
    """Make remote plans derive ``span`` (as if it were this version's default)."""

    def fake(num_samples, num_bytes, batch_size, *, remote=False):
        auto, window = _DERIVED(num_samples, num_bytes, batch_size, remote=remote)
        return (span if remote else auto), window

    monkeypatch.setattr(config_module, "default_span_window", fake)


def kw(nw=0, **extra):
    return dict(batch_size=8, num_workers=nw, seed=3, plan=PlanOptions(shuffle_window=32), **extra)


@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (2, "process"), (2, "thread")])
def test_a_derived_span_takes_the_states_and_yields_the_rest_of_the_run(
    monkeypatch, url, workers, mode
):
    extra = {"workers": WorkerOptions(mode=mode)} if workers else {}
    derive(monkeypatch, OLD)
    reference = create_loader(url, "train", **kw(workers, **extra))
    assert reference.dataset_obj.config.span == OLD
    whole = keys_of(run(reference)) + keys_of(run(reference))  # epochs 0 and 1
    saving = create_loader(url, "train", **kw(workers, **extra))
    done = keys_of(run(saving, 7))
    state = saving.state_dict()
    assert state["span"] == OLD

    derive(monkeypatch, NEW)  # a later version derives another span
    fresh = create_loader(url, "train", **kw(workers, **extra))
    assert fresh.dataset_obj.config.span == NEW
    assert keys_of(run(fresh)) != whole[: len(whole) // 2]  # the span changes the order
    resumed = create_loader(url, "train", **kw(workers, **extra))
    resumed.load_state_dict(state)
    assert resumed.dataset_obj.config.span == OLD
    rest = keys_of(run(resumed)) + keys_of(run(resumed))  # the epoch's rest, and the next
    assert done + rest == whole
    assert resumed.state_dict()["span"] == OLD  # its checkpoints keep the run's span


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_workers_made_under_the_derived_span_are_made_again(monkeypatch, url, mode):
    workers = WorkerOptions(persistent_workers=True, mode=mode)
    derive(monkeypatch, OLD)
    reference = create_loader(url, "train", **kw(2, workers=workers))
    whole = keys_of(run(reference))
    saving = create_loader(url, "train", **kw(2, workers=workers))
    done = keys_of(run(saving, 5))
    state = saving.state_dict()
    derive(monkeypatch, NEW)
    resumed = create_loader(url, "train", **kw(2, workers=workers))
    run(resumed)  # its workers are started, planning with NEW
    resumed.set_epoch(0)
    resumed.load_state_dict(state)
    assert done + keys_of(run(resumed)) == whole


def test_a_mix_of_remote_sources_takes_the_states_span_as_its_block(monkeypatch, http_server):
    for name, counts in (("a", [60, 40]), ("b", [50, 70])):
        write_dataset(str(http_server.root / name), {"train": counts})
    sources = [MixSource(f"{http_server.url}/{name}", weight=1.0) for name in ("a", "b")]
    derive(monkeypatch, OLD)
    reference = create_loader(sources, "train", **kw())
    whole = keys_of(run(reference))
    saving = create_loader(sources, "train", **kw())
    done = keys_of(run(saving, 6))
    state = saving.state_dict()
    derive(monkeypatch, NEW)
    assert keys_of(run(create_loader(sources, "train", **kw()))) != whole
    resumed = create_loader(sources, "train", **kw())
    resumed.load_state_dict(state)
    assert done + keys_of(run(resumed)) == whole


def test_an_elastic_resume_takes_the_states_span(monkeypatch, url):
    derive(monkeypatch, OLD)
    old = [
        create_loader(url, "train", **kw(drop_last=False, topology=Topology(rank=r, world_size=2)))
        for r in (0, 1)
    ]
    consumed = [k for ld in old for k in keys_of(run(ld, 6))]
    state = old[0].state_dict()
    derive(monkeypatch, NEW)
    new = [
        create_loader(
            url, "train", **kw(2, drop_last=False, topology=Topology(rank=r, world_size=3))
        )
        for r in range(3)
    ]
    rest, lengths = [], set()
    for ld in new:
        ld.load_state_dict(state)
        assert ld.dataset_obj.config.span == OLD
        got = keys_of(run(ld))
        lengths.add(len(got))
        rest += got
    assert len(lengths) == 1  # equal batches on the new ranks
    assert not set(consumed) & set(rest)
    everything = Counter(consumed + rest)
    assert set(everything) == {f"train{i:07d}" for i in range(sum(COUNTS))}
    assert sum(c - 1 for c in everything.values()) < 3 * 8  # only the new plan's padding


def test_a_span_given_explicitly_that_differs_is_refused(monkeypatch, url):
    derive(monkeypatch, OLD)
    saving = create_loader(url, "train", **kw())
    run(saving, 3)
    state = saving.state_dict()
    given = create_loader(
        url, "train", **{**kw(), "plan": PlanOptions(span=NEW, shuffle_window=32)}
    )
    with pytest.raises(StateMismatchError, match=rf"span saved={OLD} now={NEW}"):
        given.load_state_dict(state)
    assert given.dataset_obj.config.span == NEW  # refused: it plans as it did
    same = create_loader(url, "train", **{**kw(), "plan": PlanOptions(span=OLD, shuffle_window=32)})
    same.load_state_dict(state)  # given and equal: resumed as before


def test_a_refused_state_leaves_a_derived_span_as_it_was(monkeypatch, url):
    derive(monkeypatch, OLD)
    saving = create_loader(url, "train", **kw())
    run(saving, 3)
    state = saving.state_dict()
    derive(monkeypatch, NEW)
    other_seed = create_loader(url, "train", **{**kw(), "seed": 4})
    with pytest.raises(StateMismatchError, match="seed"):
        other_seed.load_state_dict(state)
    state["resume"]["batches_done"] = state["batches_done"] = 10**6  # past the epoch
    loader = create_loader(url, "train", **kw())
    with pytest.raises(StateMismatchError, match="resume point is invalid"):
        loader.load_state_dict(state)
    assert other_seed.dataset_obj.config.span == loader.dataset_obj.config.span == NEW


def test_a_packing_plan_takes_the_states_span(monkeypatch, http_server):
    from tests.test_pack_loader import _build
    from wdsloader import Packing

    _build(http_server.root / "packed")
    url = f"{http_server.url}/packed"
    kw = dict(batch_size=3, seed=4, drop_last=False, packing=Packing(max_tokens=48, window=32))

    def rows(loader, n=None):
        return [b["input_ids"].tolist() for b in run(loader, n)]

    derive(monkeypatch, OLD)
    whole = rows(create_loader(url, "train", **kw))
    saving = create_loader(url, "train", **kw)
    done = rows(saving, 4)
    state = saving.state_dict()
    derive(monkeypatch, NEW)
    assert rows(create_loader(url, "train", **kw)) != whole
    resumed = create_loader(url, "train", **kw)
    resumed.load_state_dict(state)
    assert done + rows(resumed) == whole


@pytest.mark.parametrize(("n", "span"), [(20_480, 80), (98_304, 384), (1_000_000, 584)])
def test_a_remote_span_holds_8_mib_within_256_spans(n, span):
    avg = 14_356  # shard bytes per sample of the remote bench's embedding samples
    assert _DERIVED(n, n * avg, 256, remote=True)[0] == span
