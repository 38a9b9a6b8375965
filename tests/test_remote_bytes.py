"""Bytes and requests at the server (issue 23, item 3): one epoch fetches the dataset once, with
or without a shared cache, and the manifest's sizes spare every HEAD and LIST per shard.

The suite's moto server sits behind the remote benchmark's proxy (no delay), whose request log
names each request's kind, object and byte range: what the server sent, not what we count."""

from __future__ import annotations

import re

import pytest

from bench.remote.proxy import LatencyProxy, Profile
from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.format import Manifest

COUNTS = [30, 31, 29, 30, 32, 30, 28, 30, 31, 29]  # 10 shards


@pytest.fixture()
def proxied(s3_server):
    """``(bucket_url, direct, proxied, proxy)``: a fresh bucket, storage options to the server
    (to write) and through a counting proxy (to read: the proxy sees the reads only)."""
    from tests.conftest import new_bucket

    host, port = s3_server.removeprefix("http://").split(":")
    url, options = new_bucket(s3_server, "bytes")
    with LatencyProxy((host, int(port)), Profile("none", 0.0, None)) as proxy:
        via = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
        yield url, options, via, proxy


def fetched(log: list[list], sizes: dict[str, int]) -> dict[str, int]:
    """Bytes the server sent per shard file (``sizes``: object path -> size) from the log."""
    out = dict.fromkeys(sizes, 0)
    for _, _, kind, target, rng in log:
        path = target.partition("?")[0]
        if path not in sizes or kind not in ("GET", "GET-range"):
            continue
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", rng):
            stop = min(int(m[2]) + 1, sizes[path]) if m[2] else sizes[path]
            out[path] += stop - int(m[1])
        else:
            out[path] += sizes[path]
    return out


def per_shard(log: list[list], kinds: tuple[str, ...]) -> list[list]:
    return [entry for entry in log if entry[2] in kinds]


def _dataset(url: str, options: dict) -> tuple[str, Manifest, dict[str, int]]:
    root = f"{url}/ds"
    manifest = write_dataset(root, {"train": COUNTS}, storage_options=options)
    prefix = "/" + root.removeprefix("s3://")
    sizes = {f"{prefix}/{s.path}": s.num_bytes for s in manifest.split("train").shards}
    return root, manifest, sizes


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_one_epoch_fetches_the_dataset_once_with_any_workers(proxied, num_workers):
    url, direct, options, proxy = proxied
    root, _, sizes = _dataset(url, direct)
    loader = create_loader(
        root, "train", batch_size=16, num_workers=num_workers, drop_last=False, seed=3,
        storage_options=options,
    )  # fmt: skip
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == [f"train{i:07d}" for i in range(sum(COUNTS))]
    log = proxy.snapshot(log=True)["log"]
    got = fetched(log, sizes)
    assert sum(got.values()) / sum(sizes.values()) <= 1.05, got
    # no request the manifest makes unnecessary: no HEAD (sizes are in the manifest); one LIST
    # of the split's folder (the start-up check that every shard is there), not one per shard
    assert [e[2:4] for e in per_shard(log, ("HEAD", "LIST"))] == [
        [
            "LIST",
            f"/{root[5:].split('/')[0]}?list-type=2&prefix=ds%2Ftrain%2F&delimiter=%2F"
            "&encoding-type=url",
        ]
    ]
