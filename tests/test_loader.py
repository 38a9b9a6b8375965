"""create_loader end to end: exactly once, determinism, exact and elastic resume, set_epoch."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
import torch

from tests.dataset_factory import write_dataset
from tests.http_server import Faults, http_server_fixture  # noqa: F401
from wdsloader import ReadOptions, create_loader, set_epoch
from wdsloader.errors import DecodeError, ManifestError, ShardFormatError
from wdsloader.format import Manifest
from wdsloader.stream.config import resolve_config
from wdsloader.stream.loader_options import LoaderOptions
from wdsloader.stream.options import PlanOptions

COUNTS = [37, 50, 13, 44, 29]  # 173 samples, unequal shards


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader") / "ds"
    write_dataset(str(root), {"train": COUNTS, "val": [10, 7]})
    return str(root)


def keys_of(batches):
    return [k for b in batches for k in b["__key__"]]


def run(loader, n=None):
    """The batches of one pass over ``loader``, stopping after the ``n``-th if given."""
    out = []
    for b in loader:
        out.append(b)
        if len(out) == n:
            break
    return out


def same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x["__key__"] == y["__key__"]
        assert torch.equal(x["vec"], y["vec"]) and torch.equal(x["idx"], y["idx"])


def test_batches_carry_decoded_fields(ds):
    loader = create_loader(ds, "val", batch_size=4)
    batches = run(loader)
    assert len(batches) == len(loader) == 5  # 17 samples, drop_last False for val
    b = batches[0]
    assert b["vec"].dtype == torch.float32 and b["vec"].shape == (4, 4)
    assert b["idx"].tolist() == [0, 1, 2, 3]  # val is not shuffled
    assert torch.equal(b["vec"][1], torch.arange(10, 14, dtype=torch.float32))
    assert b["meta"][2] == {"i": 2, "shard": 0}
    assert batches[-1]["idx"].tolist() == [16]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_once_per_epoch_and_epochs_differ(ds, workers):
    loader = create_loader(ds, "train", batch_size=8, num_workers=workers, drop_last=False)
    e0 = run(loader)
    e1 = run(loader)  # iterating to the end moved the loader to epoch 1
    for epoch in (e0, e1):
        keys = keys_of(epoch)
        assert sorted(keys) == sorted(f"train{i:07d}" for i in range(sum(COUNTS)))
        assert len(epoch) == len(loader)
    assert keys_of(e0) != keys_of(e1)
    ordered = [int(k[5:]) for k in keys_of(e0)]
    assert ordered != sorted(ordered)


def test_same_config_gives_identical_batches(ds):
    a = run(create_loader(ds, "train", batch_size=8, num_workers=2, seed=3))
    b = run(create_loader(ds, "train", batch_size=8, num_workers=2, seed=3))
    same_batches(a, b)
    c = run(create_loader(ds, "train", batch_size=8, num_workers=2, seed=4))
    assert keys_of(a) != keys_of(c)


def test_ranks_get_equal_batches_and_disjoint_samples(ds):
    world, bs = 3, 8
    loaders = [
        create_loader(ds, "train", batch_size=bs, rank=r, world_size=world) for r in range(world)
    ]
    outs = [run(ld) for ld in loaders]
    n = sum(COUNTS)
    assert {len(o) for o in outs} == {len(loaders[0])} == {n // (world * bs)}
    keys = [k for o in outs for k in keys_of(o)]
    assert len(keys) == len(set(keys)) and n - len(keys) < world * bs
    assert loaders[0].dropped == n - len(keys) == 173 % 24 and loaders[0].padding == 0
    padded = create_loader(ds, "train", batch_size=bs, rank=0, world_size=world, drop_last=False)
    assert padded.padding == world * -(-n // world) - n == 1 and padded.dropped == 0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_exact_resume(ds, workers, k):
    kw = dict(batch_size=8, num_workers=workers, drop_last=False)
    ref_loader = create_loader(ds, "train", **kw)
    reference = run(ref_loader) + run(ref_loader)  # epochs 0 and 1
    per_epoch = len(ref_loader)
    loader = create_loader(ds, "train", **kw)
    got = run(loader, k)
    state = loader.state_dict()
    resumed = create_loader(ds, "train", **kw)
    resumed.load_state_dict(state)
    rest = run(resumed)  # rest of epoch 0 (or of epoch 1 when k crossed it)
    rest += run(resumed) if k < per_epoch else []
    same_batches(got + rest, reference[: len(got) + len(rest)])
    assert len(got) + len(rest) == 2 * per_epoch


def test_resume_across_epoch_boundary_and_twice(ds):
    kw = dict(batch_size=8, num_workers=2, drop_last=True)
    ref = create_loader(ds, "train", **kw)
    reference = run(ref) + run(ref)
    n = len(ref)
    first = create_loader(ds, "train", **kw)
    got = run(first)  # a whole epoch: the state now points at epoch 1, batch 0
    state = first.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    second = create_loader(ds, "train", **kw)
    second.load_state_dict(state)
    got += run(second, 3)
    third = create_loader(ds, "train", **kw)
    third.load_state_dict(second.state_dict())  # resumed twice
    got += run(third)
    same_batches(got, reference)
    assert len(got) == 2 * n


def test_elastic_resume_delivers_the_rest_once(ds):
    bs = 4
    old = [
        create_loader(ds, "train", batch_size=bs, rank=r, world_size=2, drop_last=False)
        for r in range(2)
    ]
    consumed = [k for ld in old for k in keys_of(run(ld, 7))]
    state = old[0].state_dict()
    new = [
        create_loader(
            ds, "train", batch_size=bs, rank=r, world_size=3, num_workers=2, drop_last=False
        )
        for r in range(3)
    ]
    rest = []
    lengths = set()
    for ld in new:
        ld.load_state_dict(state)
        got = run(ld)
        lengths.add(len(got))
        rest += keys_of(got)
    assert len(lengths) == 1  # equal batches on the new ranks
    everything = Counter(consumed + rest)
    assert set(everything) == {f"train{i:07d}" for i in range(sum(COUNTS))}
    assert not set(consumed) & set(rest)
    assert sum(c - 1 for c in everything.values()) < 3 * bs  # only the new plan's padding


def test_set_epoch_reaches_persistent_workers(ds):
    kw = dict(batch_size=8, num_workers=2, persistent_workers=True)
    loader = create_loader(ds, "train", **kw)
    e0 = run(loader)
    set_epoch(loader, 1)
    e1 = run(loader)
    set_epoch(loader, 1)
    e1_again = run(loader)
    fresh = create_loader(ds, "train", epoch=1, **kw)
    assert keys_of(e0) != keys_of(e1)
    same_batches(e1, run(fresh))
    same_batches(e1, e1_again)


def test_fields_limit_decoding(ds):
    b = next(iter(create_loader(ds, "val", batch_size=3, fields=["idx"])))
    assert set(b) == {"idx", "__key__", "__index__"}


def test_missing_manifest_shard_and_split_are_reported(tmp_path, ds):
    with pytest.raises(ManifestError, match="manifest not found"):
        create_loader(str(tmp_path / "nothing"), "train", batch_size=2)
    with pytest.raises(ManifestError, match="split 'test'"):
        create_loader(ds, "test", batch_size=2)
    root = tmp_path / "broken"
    write_dataset(str(root), {"train": [5, 5]})
    (root / "train" / "shard-000001.tar").unlink()
    with pytest.raises((ShardFormatError, FileNotFoundError), match="shard-000001.tar"):
        create_loader(str(root), "train", batch_size=2)


@pytest.mark.parametrize("gather", [True, False])
def test_symbolic_dims_are_checked_against_the_data(tmp_path, gather):
    """The manifest says ``v`` is ``["D"]`` with ``D=4`` but the data hold 3 values: an error
    naming shard, sample key, field, expected and found (as for a literal shape), never a
    (B, 3) batch while ``output_schema()`` says 4."""
    from build_shards import build_shards

    rows = [{"__key__": f"k{i}", "v": np.arange(3, dtype=np.float32)} for i in range(8)]
    build_shards(rows, tmp_path, splits={"train": 1.0})
    manifest = Manifest.load(str(tmp_path)).to_dict()
    manifest["schema"]["v"]["shape"], manifest["dims"] = ["D"], {"D": 4}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    loader = create_loader(tmp_path, "train", batch_size=4, shuffle=False, gather=gather)
    with pytest.raises(
        DecodeError,
        match=r"train/train-\S+\.tar: sample 'k0', field 'v' \(member k0\.v\.npy\) does not "
        r"match the schema: shape \[3\], schema says \['D'\] with D=4",
    ):
        next(iter(loader))


def test_corrupt_shard_raises_with_location_or_is_skipped(tmp_path):
    root = tmp_path / "corrupt"
    write_dataset(str(root), {"train": [6, 6]})
    shard = root / "train" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    offsets = np.fromfile(str(shard.parent / f".{shard.name}.wdsidx"), dtype="<u8")
    data[int(offsets[2]) + 5] ^= 0xFF  # the header of the third sample's first member
    shard.write_bytes(bytes(data))
    loader = create_loader(str(root), "train", batch_size=4, shuffle=False, drop_last=False)
    with pytest.raises(ShardFormatError, match=rf"shard-000001.tar.*byte {int(offsets[2])}"):
        run(loader)
    skipping = create_loader(
        str(root), "train", batch_size=4, shuffle=False, drop_last=False, on_error="skip"
    )
    keys = keys_of(run(skipping))
    assert len(keys) == 11 and "train0000008" not in keys
    assert skipping.stats["skipped_samples"] == 1


def test_loader_streams_from_s3(s3_bucket):
    url, options = s3_bucket
    write_dataset(f"{url}/ds", {"train": [9, 8]}, storage_options=options)
    loader = create_loader(
        f"{url}/ds", "train", batch_size=4, drop_last=False, storage_options=options
    )
    keys = keys_of(run(loader))
    assert sorted(keys) == [f"train{i:07d}" for i in range(17)]


def test_loader_over_http_survives_dropped_connections(http_server):
    write_dataset(str(http_server.root / "ds"), {"train": [30, 25, 20]})
    http_server.faults = Faults(first_gets=3)  # three shard reads cut off mid-body
    loader = create_loader(
        f"{http_server.url}/ds",
        "train",
        batch_size=8,
        num_workers=2,
        drop_last=False,
        read_options=ReadOptions(backoff=0),
    )
    keys = keys_of(run(loader))
    assert sorted(keys) == [f"train{i:07d}" for i in range(75)]  # each exactly once
    assert http_server.drops() == 3


@pytest.mark.slow
def test_default_shuffle_quality_on_100k_samples_in_50_shards(tmp_path):
    from scipy.stats import spearmanr

    write_dataset(str(tmp_path / "big"), {"train": [2000] * 50})
    loader = create_loader(str(tmp_path / "big"), "train", batch_size=256, fields=["idx"])
    stream = torch.cat([b["idx"] for b in loader]).numpy()
    n = 100_000
    assert len(stream) == n - n % 256 and len(set(stream.tolist())) == len(stream)
    rho = spearmanr(stream, np.arange(len(stream))).statistic
    assert abs(rho) < 0.05
    assert np.abs(np.diff(stream)).mean() / n > 0.25  # neighbours come from far apart


def test_unreadable_or_newer_manifest_is_reported_at_startup(tmp_path):
    root = tmp_path / "m"
    write_dataset(str(root), {"train": [3]})
    good = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(good[:40])
    with pytest.raises(ManifestError, match=r"m/manifest.json: manifest is not valid JSON"):
        create_loader(str(root), "train", batch_size=2)
    (root / "manifest.json").write_text(good.replace('"version": "1.0"', '"version": "7.2"'))
    with pytest.raises(ManifestError, match="format version 7.2 is newer"):
        create_loader(str(root), "train", batch_size=2)


def test_loader_caches_remote_shards_locally(s3_bucket, tmp_path):
    url, options = s3_bucket
    write_dataset(f"{url}/cached", {"train": [9, 8]}, storage_options=options)
    cache = tmp_path / "cache"
    kw = dict(batch_size=4, drop_last=False, storage_options=options, cache_dir=str(cache))
    first = keys_of(run(create_loader(f"{url}/cached", "train", **kw)))
    cached = sorted(p.name for p in cache.iterdir() if p.name.endswith(".tar"))
    assert len(cached) == 2 and all(
        n.endswith(("shard-000000.tar", "shard-000001.tar")) for n in cached
    )
    assert sorted(first) == [f"train{i:07d}" for i in range(17)]


def test_remote_reads_whole_spans_not_one_request_per_sample(http_server):
    # 2,600 samples in 4 shards: remotely a span holds many samples (fewer round trips); the
    # first batch is read on its own (a request per sample at most), then the rest of its
    # window in whole spans
    write_dataset(str(http_server.root / "ds"), {"train": [700, 650, 600, 650]})
    loader = create_loader(f"{http_server.url}/ds", "train", batch_size=64, seed=1)
    local = create_loader(str(http_server.root / "ds"), "train", batch_size=64, seed=1)
    assert loader.dataset_obj.config.span > local.dataset_obj.config.span
    it = iter(loader)
    first = next(it)
    assert len(first["__key__"]) == 64
    keys = keys_of([first, *it])
    assert len(keys) == len(set(keys)) == len(loader) * 64
    store = loader.dataset_obj.store
    # the window covers the split: its spans are adjacent in each shard, a request per shard
    # but for the holes the first batch's samples leave (one request per sample would be
    # 2,600); each byte once
    assert store.stats["requests"] <= 4 + 2 * 64 + 16  # indexes, first batch, the rest
    shards = loader.dataset_obj.shards
    indexes = sum(8 * (s.num_samples + 1) for s in shards)
    samples = sum(int(store.index(s)[-1] - store.index(s)[0]) for s in shards)
    assert store.stats["bytes_fetched"] <= samples + indexes  # (drop_last: 40 samples unread)


def test_the_seed_000_positional_order_then_keyword_only(ds):
    """Seed 000's ``create_loader(dataset_dir, split, batch_size, num_workers, distributed,
    epoch, drop_last, pin_memory)`` is called by position; everything after is keyword-only."""
    by_position = create_loader(ds, "train", 4, 2, False, 1, False, False)
    by_name = create_loader(
        ds, "train", batch_size=4, num_workers=2, distributed=False, epoch=1, drop_last=False,
        pin_memory=False,
    )  # fmt: skip
    assert by_position.num_workers == 2 and by_position.pin_memory is False
    assert len(by_position) == len(by_name) == -(-sum(COUNTS) // 4)  # drop_last=False
    same_batches(run(by_position), run(by_name))  # epoch 1 of both
    with pytest.raises(TypeError, match="from 3 to 8 positional arguments but 9 were given"):
        create_loader(ds, "train", 4, 0, False, 0, None, True, 0)


def test_manifest_property_gives_the_dims_validate_batch_needs(ds):
    """docs/loading.md's ``validate_batch(batch, loader.output_schema(), dims=loader.manifest.dims)``."""
    from wdsloader import validate_batch

    loader = create_loader(ds, "val", batch_size=4)
    assert loader.manifest == Manifest.load(ds) and loader.manifest.dims == {"D": 4}
    validate_batch(next(iter(loader)), loader.output_schema(), dims=loader.manifest.dims)


def test_stats_are_cumulative_over_epochs(ds):
    loader = create_loader(ds, "val", batch_size=4, num_workers=1)
    for epoch in (1, 2):
        batches = run(loader)
        assert loader.stats["samples"] == 17 * epoch and loader.stats["batches"] == 5 * epoch
    assert len(batches) == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"multiprocessing_context": "spawn"}, r"multiprocessing_context='spawn' needs num_work"),
        ({"prefetch_factor": 4}, r"persistent_workers and prefetch_factor need num_workers > 0"),
        ({"max_skipped": 2}, r"max_skipped=2 needs on_error='skip'"),
        ({"cache_limit_bytes": 10}, r"cache_limit_bytes=10 needs a cache_dir"),
        ({"distributed": True, "rank": 0, "world_size": 1}, r"rank=0 / world_size=1 would be"),
        (
            {"read_options": ReadOptions(verify_checksum=True), "verify_checksum": False},
            r"verify_checksum=False conflicts with read_options\.verify_checksum=True",
        ),
        (
            {"read_options": ReadOptions(cache_dir="/c1"), "cache_dir": "/c2"},
            r"cache_dir='/c2' conflicts with read_options\.cache_dir='/c1'",
        ),
    ],
)
def test_an_explicit_option_that_would_be_unused_is_an_error(ds, options, message):
    with pytest.raises(ValueError, match=message):
        create_loader(ds, "train", batch_size=4, **options)


def test_config_is_resolved_against_the_manifest(ds):
    manifest = Manifest.load(ds)
    train = resolve_config(manifest, LoaderOptions(split="train", batch_size=8))
    val = resolve_config(
        manifest,
        LoaderOptions(
            split="val", batch_size=8, num_workers=2, plan=PlanOptions(shuffle_window=16)
        ),
    )
    assert (train.plan.shuffle, train.plan.drop_last, val.plan.shuffle, val.plan.drop_last) == (
        True,
        True,
        False,
        False,
    )
    assert (val.plan.counts, val.plan.num_workers, val.readahead_batches) == ((10, 7), 2, 2)
    assert (train.collate, train.curriculum, train.fields) == ("default", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.epoch = 1  # type: ignore[misc]
