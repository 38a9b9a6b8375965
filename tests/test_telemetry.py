"""``loader.metrics()``: the numbers are right, not just present. A collate that sleeps 10 ms
shows ~10 ms a batch in collate; the consumer's wait covers the work when there are no workers;
bytes read are the store's; hooks fire every N batches."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch

from build_shards import ShardOptions, build_shards
from wdsloader import create_loader
from wdsloader.format.codecs import register_codec, unregister_codec
from wdsloader.io.file_store import LocalStore
from wdsloader.io.store import STORES
from wdsloader.stream import LoggingReporter, TensorBoardReporter

SLEEP = 0.05  # a collate this slow stands out of decode and fetch times on a loaded machine
STAGE_SLEEP = 0.002  # per sample decoded (slow decode), per storage request (slow fetch)


def build(root) -> None:
    items = [{"emb": np.full(64, i, np.float32), "label": i % 5} for i in range(240)]
    build_shards(items, root, shards=ShardOptions(max_count=60))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("telemetry") / "ds"
    build(root)
    return root


def slow_collate(samples):
    time.sleep(SLEEP)
    return {"emb": torch.stack([torch.as_tensor(s["emb"]) for s in samples])}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_collate_shows_in_collate_time(built, workers):
    loader = create_loader(built, "train", 20, workers, collate_fn=slow_collate)
    n = sum(1 for _ in loader)
    m = loader.metrics()
    assert n == 12 and m["batches"] == 12 and m["samples"] == 240 and m["epoch"] == 0
    assert 12 * SLEEP <= m["collate_s"] < 12 * SLEEP + 1.0
    assert m["decode_s"] < 12 * SLEEP and m["fetch_s"] < 12 * SLEEP  # no sleep in them
    if workers == 0:  # the training loop waited for all of it
        assert m["wait_s"] >= m["collate_s"] + m["decode_s"]


def test_bytes_and_requests_are_the_stores_and_the_epoch_resets_them(built):
    loader = create_loader(built, "train", 20, shuffle=False)
    list(loader)
    first = loader.metrics()
    store = loader.dataset_obj.store.stats
    assert first["bytes_read"] == store["bytes_read"] > 0
    assert first["requests"] == store["requests"] > 0
    list(loader)  # the next epoch counts from its own start
    second = loader.metrics()
    assert second["epoch"] == 1 and second["samples"] == 240
    assert second["bytes_read"] == store["bytes_read"] - first["bytes_read"]


def test_hooks_fire_every_n_batches_and_the_reporters_write(built, caplog):
    calls = []

    class Writer:  # the part of SummaryWriter the reporter uses
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

    writer = Writer()
    loader = create_loader(built, "train", 20)
    loader.add_metrics_hook(lambda m, step: calls.append((step, m["batches"])), every=5)
    loader.add_metrics_hook(TensorBoardReporter(writer), every=12)
    loader.add_metrics_hook(LoggingReporter(), every=6)
    with caplog.at_level(logging.INFO, logger="wdsloader.stream.telemetry"):
        list(loader)
    assert calls == [(5, 5.0), (10, 10.0)]
    assert ("data/samples", 240.0, 12) in writer.scalars
    assert {tag for tag, _, _ in writer.scalars} >= {"data/wait_s", "data/collate_s"}
    assert caplog.text.count("data loader after") == 2
    with pytest.raises(ValueError, match="every must be >= 1"):
        loader.add_metrics_hook(print, every=0)


def test_all_ranks_gives_the_mean_and_the_slowest_wait(built, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        loader = create_loader(built, "train", 20, collate_fn=slow_collate)
        list(loader)
        mine, group = loader.metrics(), loader.metrics(all_ranks=True)
    finally:
        dist.destroy_process_group()
    assert group["max_wait_s"] == pytest.approx(mine["wait_s"])
    assert {k: group[k] for k in mine} == pytest.approx(mine)


class SlowCodec:
    """A made-up encoding ``slow``: bytes stored as they are, each decode sleeping
    :data:`STAGE_SLEEP`."""

    name = "slow"
    encodings = ("slow",)
    fixed_width = False

    def encode(self, value, spec):
        return bytes(value)

    def decode(self, data, spec):
        time.sleep(STAGE_SLEEP)
        return bytes(data)


SLOW = SlowCodec()


class SlowStore(LocalStore):
    """A local store whose every storage request takes :data:`STAGE_SLEEP` longer."""

    def _read_files(self, reqs, *args, **kwargs):
        time.sleep(STAGE_SLEEP * len(reqs))
        return super()._read_files(reqs, *args, **kwargs)


@pytest.fixture
def slow_codec():
    register_codec(SLOW)
    yield SLOW
    unregister_codec(SLOW)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_decode_shows_in_decode_time(tmp_path, slow_codec, workers):
    items = [{"n": i, "blob.slow": b"x" * (i % 7)} for i in range(120)]
    build_shards(items, tmp_path / "ds", shards=ShardOptions(max_count=40))
    loader = create_loader(tmp_path / "ds", "train", 10, workers, collate_fn=list)
    samples = [s for batch in loader for s in batch]
    m = loader.metrics()
    assert sorted(s["blob"] for s in samples) == sorted(b"x" * (i % 7) for i in range(120))
    injected = 120 * STAGE_SLEEP  # one decode per sample, in the workers' own thread
    assert injected <= m["decode_s"] < injected + 1.5
    assert m["fetch_s"] < injected and m["collate_s"] < injected


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_fetch_shows_in_fetch_time(built, monkeypatch, workers):
    monkeypatch.setitem(STORES, "local", "tests.test_telemetry:SlowStore")
    loader = create_loader(built, "train", 20, workers)
    assert type(loader.dataset_obj.store) is SlowStore
    assert sum(len(b["__key__"]) for b in loader) == 240
    m = loader.metrics()
    injected = m["requests"] * STAGE_SLEEP
    assert m["requests"] >= 12  # at least one request a batch
    # the next group is read while the worker decodes, collates and hands over this one, so
    # the wait is the injected delay less that time: the other stages' (measured) and the
    # hand-over's (not measured: a quarter of the delay allowed, a lenient ratio)
    slack = m["decode_s"] + m["collate_s"]
    assert 0.75 * injected - slack <= m["fetch_s"] < injected + 1.5
    assert m["decode_s"] < injected and m["collate_s"] < injected


@pytest.mark.parametrize("workers", [0, 1, 2])  # a worker counts from its own first read
def test_on_s3_requests_are_the_servers_and_bytes_each_samples_once(s3_bucket, caplog, workers):
    import re

    from wdsloader.io.manifest_io import load_manifest

    url, options = s3_bucket
    items = [{"emb": np.full(64, i, np.float32), "label": i % 5} for i in range(240)]
    build_shards(items, f"{url}/ds", shards=ShardOptions(max_count=60), storage_options=options)
    loader = create_loader(f"{url}/ds", "train", 20, workers, storage_options=options)
    shards = load_manifest(f"{url}/ds", options).split("train").shards
    iter(loader)  # the indexes are read before the epoch
    caplog.set_level(logging.INFO, logger="werkzeug")  # moto's access log: one line a request
    caplog.clear()
    assert sum(len(b["__key__"]) for b in loader) == 240
    m = loader.metrics()
    gets = [
        re.search(r"GET (\S+)", r.getMessage())[1]  # type: ignore[index]
        for r in caplog.records
        if r.name == "werkzeug"
    ]
    assert len(gets) == m["requests"] >= len(shards)
    assert all(g.endswith(".tar") for g in gets)
    spans = sum(loader.dataset_obj.store.index(s)[-1] - loader.dataset_obj.store.index(s)[0]
                for s in shards)  # fmt: skip
    assert m["bytes_read"] == spans and m["samples"] == 240 and m["batches"] == 12


# -- under torchrun: its ``scenario`` runs in the launch the tests under DDP share
# (tests/ddp_launch.py)
PHASES = ("first",)


class SleepyCollate:
    """Stacks ``emb``; sleeps ``sleep`` seconds first (picklable: a module-level class)."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def __call__(self, samples: list[dict]) -> dict:
        time.sleep(self.sleep)
        return {"emb": torch.stack([torch.as_tensor(s["emb"]) for s in samples])}


def prepare(folder) -> None:
    build(folder / "ds")


def scenario(folder, phase: str) -> None:
    """This rank reads an epoch, rank 1's collate sleeping 2 * SLEEP a batch (so rank 1 waits
    longest); rank 0 writes every rank's own metrics and ``loader.metrics(all_ranks=True)`` to
    ``folder/{phase}.json``."""
    import json

    import torch.distributed as dist

    rank = dist.get_rank()
    collate = SleepyCollate(2 * SLEEP if rank == 1 else 0.0)
    loader = create_loader(folder / "ds", "train", 10, 0, distributed=True, collate_fn=collate)
    batches = sum(1 for _ in loader)
    mine, group = loader.metrics(), loader.metrics(all_ranks=True)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(
        gathered, {"rank": rank, "batches": batches, "mine": mine, "group": group}
    )
    if rank == 0:
        (folder / f"{phase}.json").write_text(json.dumps(gathered))


@pytest.mark.slow
def test_all_ranks_over_two_processes_gives_the_slowest_ranks_wait_and_the_mean(ddp_reports):
    r0, r1 = ddp_reports[__name__]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["batches"] == r1["batches"] == 12  # 240 samples, 2 ranks, batches of 10
    fast, slow = r0["mine"], r1["mine"]
    assert slow["collate_s"] >= 12 * 2 * SLEEP > fast["collate_s"]
    assert slow["wait_s"] >= slow["collate_s"] and slow["wait_s"] > fast["wait_s"]
    for r in (r0, r1):  # every rank gets the same answer: rank 1's wait, the mean of each
        group = r["group"]
        assert group["max_wait_s"] == slow["wait_s"]
        for name, value in fast.items():
            assert group[name] == pytest.approx((value + slow[name]) / 2), name


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_counts_every_sources_samples_bytes_and_a_slow_collate(built, tmp_path, workers):
    from wdsloader import Mix, MixSource

    other = tmp_path / "other"
    items = [{"emb": np.full(64, -i, np.float32), "label": 7} for i in range(120)]
    build_shards(items, other, shards=ShardOptions(max_count=40))
    mix = Mix([MixSource(built, name="a", weight=2), MixSource(other, name="b", weight=1)])
    loader = create_loader(mix, "train", 20, workers, collate_fn=slow_collate, seed=1)
    n = sum(1 for _ in loader)
    m = loader.metrics()
    assert m["batches"] == n == len(loader) and m["samples"] == 20 * n
    assert n * SLEEP <= m["collate_s"] < n * SLEEP + 1.0
    sources = loader.dataset_obj.store.stores
    if workers == 0:  # in process: every source's store counted, no byte twice
        assert m["bytes_read"] == sum(s.stats["bytes_read"] for s in sources)
        assert m["requests"] == sum(s.stats["requests"] for s in sources) > 0
    assert m["bytes_read"] >= 20 * n * 64 * 4  # every sample's array at least once


@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (2, "process"), (2, "thread")])
def test_a_mix_counts_each_sources_samples_per_epoch(built, tmp_path, workers, mode):
    from wdsloader import Mix, MixSource, WorkerOptions

    other = tmp_path / "other"
    build_shards([{"emb": np.zeros(64, np.float32), "label": 7}] * 90, other,
                 shards=ShardOptions(max_count=40))  # fmt: skip
    mix = Mix(
        [MixSource(built, name="a", weight=2), MixSource(other, name="b", repeat=1.5)],
        source_field="src",
    )
    loader = create_loader(
        mix, "train", 20, workers, seed=1, drop_last=False, workers=WorkerOptions(mode=mode)
    )
    for epoch in range(2):
        loader.set_epoch(epoch)
        src = torch.cat([batch["src"] for batch in loader]).tolist()
        m = loader.metrics()  # this epoch's, not the loader's totals (stats)
        assert (m["samples/a"], m["samples/b"]) == (src.count(0), src.count(1))
        assert m["samples/b"] == 135 and m["samples/a"] + m["samples/b"] == m["samples"]
    assert loader.stats["samples/b"] == 270
