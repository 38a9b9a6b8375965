"""What ``create_loader`` does over S3 before the first batch: one client for the manifest, the
listing and the indexes, and the listing of the shard check in flight while the indexes are
read (a round trip less on the way to the first batch), its errors still first."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from wdsloader import ErrorPolicy, ReadOptions, create_loader
from wdsloader.errors import ShardFormatError
from wdsloader.io import ShardStore
from wdsloader.io.retry import RemoteFiles
from wdsloader.io.storage import url_to_fs

COUNTS = [20, 13, 7]


def _loader(root: str, opts: dict, transport: str, **kw):
    read = ReadOptions(storage_options=opts, transport=transport)
    return create_loader(root, "train", batch_size=8, seed=3, read_options=read, **kw)


def _epoch_ids(loader) -> list[int]:
    return sorted(int(i) for b in loader for i in np.asarray(b["idx"]).tolist())


def test_create_loader_sets_up_one_s3_client_for_manifest_listing_indexes_and_reads(
    s3_bucket, s3_transport, monkeypatch
):
    aiobotocore_session = pytest.importorskip("aiobotocore.session")
    url, opts = s3_bucket
    root = f"{url}/ds"
    write_dataset(root, {"train": COUNTS}, storage_options=opts)
    clients: list[str] = []
    create = aiobotocore_session.AioSession.create_client

    def counted(self, *args, **kwargs):
        clients.append(args[0] if args else kwargs.get("service_name", "?"))
        return create(self, *args, **kwargs)

    monkeypatch.setattr(aiobotocore_session.AioSession, "create_client", counted)
    loader = _loader(root, opts, s3_transport)
    assert _epoch_ids(loader) == list(range(sum(COUNTS)))  # every sample once
    # s3fs: one client (its set-up, credentials and region lookup once), not one for the
    # manifest and another for the shards; obstore: at most one s3fs client (none, or the one
    # that reads indexes and listings where obstore is kept for the shards' bytes)
    if s3_transport == "fsspec":
        assert clients == ["s3"]
    else:
        assert len(clients) <= 1


def test_the_check_lists_the_shards_while_their_indexes_are_read(s3_bucket, monkeypatch):
    url, opts = s3_bucket
    root = f"{url}/ds"
    write_dataset(root, {"train": COUNTS}, storage_options=opts)
    index_read = threading.Event()
    seen: list[bool] = []
    list_dir, index_bytes = RemoteFiles.list_dir, ShardStore._index_bytes

    def listing(self, folder):
        # the listing answers once an index read has started (or after 10 s: sequential)
        seen.append(index_read.wait(10))
        return list_dir(self, folder)

    def index(self, shard, expected):
        index_read.set()
        return index_bytes(self, shard, expected)

    monkeypatch.setattr(RemoteFiles, "list_dir", listing)
    monkeypatch.setattr(ShardStore, "_index_bytes", index)
    loader = _loader(root, opts, "fsspec")
    assert seen == [True]  # one listing of train/, in flight while the indexes were read
    assert _epoch_ids(loader) == list(range(sum(COUNTS)))


def test_a_missing_file_is_named_by_the_check_not_by_the_index_read_beside_it(s3_bucket):
    url, opts = s3_bucket
    root = f"{url}/ds"
    m = write_dataset(root, {"train": COUNTS}, storage_options=opts)
    shard = m.splits["train"].shards[1]
    fs, base = url_to_fs(root, opts)
    fs.rm(f"{base}/{shard.idx_path}")
    with pytest.raises(FileNotFoundError) as info:
        _loader(root, opts, "fsspec")  # the index read fails too: the check's error wins
    assert str(info.value).startswith(f"[Errno 2] 1 shard file(s) missing: {root}/{shard.idx_path}")
    with pytest.raises(
        ShardFormatError, match=r"\.shard-000001\.tar\.wdsidx: index file not found"
    ):
        _loader(root, opts, "fsspec", errors=ErrorPolicy(check_shards=False))


def test_the_manifest_read_through_the_store_is_retried_on_a_transient_error(
    s3_bucket, monkeypatch
):
    s3fs = pytest.importorskip("s3fs")
    url, opts = s3_bucket
    root = f"{url}/ds"
    write_dataset(root, {"train": COUNTS}, storage_options=opts)
    failed: list[str] = []
    cat_file = s3fs.S3FileSystem._cat_file

    async def flaky(self, path, *args, **kwargs):
        if path.endswith("manifest.json") and not failed:
            failed.append(path)
            raise ConnectionResetError("connection reset by peer")
        return await cat_file(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", flaky)
    loader = _loader(root, opts, "fsspec")  # the store's client retries nothing itself
    assert failed == [f"{root.removeprefix('s3://')}/manifest.json"]
    assert loader.manifest.split("train").num_samples == sum(COUNTS)
    assert _epoch_ids(loader) == list(range(sum(COUNTS)))


# a fresh interpreter: its modules after an epoch tell which clients the loader set up
_NW0_EPOCH = """
import json, sys
from wdsloader import create_loader
from wdsloader.io import ReadOptions
from wdsloader.stream.options import WorkerOptions
root, storage, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
more = {"num_workers": threads, "workers": WorkerOptions(mode="thread")} if threads else {}
loader = create_loader(root, "train", batch_size=8, seed=3, drop_last=False,
                       read_options=ReadOptions(storage_options=storage), **more)
ids = sorted(int(i) for b in loader for i in b["idx"].tolist())
clients = sorted(m for m in ("s3fs", "aiobotocore", "botocore") if m in sys.modules)
print(json.dumps([ids, clients]))
"""


@pytest.mark.parametrize("threads", [0, 2])
def test_at_num_workers_0_everything_is_read_through_obstore_without_importing_s3fs(
    s3_server, monkeypatch, tmp_path, threads
):
    """A process that forks no workers (``num_workers=0``, or worker threads) reads its shards through obstore (the default transport
    where it can), so the manifest, listing and indexes go through it too: no s3fs import and
    client set-up (~0.6 s at 40 ms RTT) before the first request, and no botocore import for
    a region no AWS config can give. Every request (the manifest's GET first) is obstore's."""
    pytest.importorskip("obstore")
    import json
    import os
    import subprocess
    import sys

    from bench.remote import proxy as proxy_module
    from tests.conftest import classify_by_client, new_bucket

    classify_by_client(monkeypatch)
    url, options = new_bucket(s3_server, "nw0")
    root = f"{url}/ds"
    write_dataset(root, {"train": COUNTS}, storage_options=options)
    host, port = s3_server.removeprefix("http://").split(":")
    with proxy_module.LatencyProxy(
        (host, int(port)), proxy_module.Profile("none", 0.0, None)
    ) as proxy:
        via = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
        run = subprocess.run(
            [sys.executable, "-c", _NW0_EPOCH, root, json.dumps(via), str(threads)],
            capture_output=True, text=True, timeout=240, env=env, check=False,
        )  # fmt: skip
        log = proxy.snapshot(log=True)["log"]
    assert run.returncode == 0, run.stderr[-3000:]
    ids, clients = json.loads(run.stdout.strip().splitlines()[-1])
    assert ids == list(range(sum(COUNTS)))  # every sample once
    assert clients == []
    assert log[0][3] == "/" + root.removeprefix("s3://") + "/manifest.json"  # one GET first
    assert {e[2].split()[1] for e in log} == {"obstore"}


def test_the_indexes_of_many_shards_are_requested_together(http_server, monkeypatch):
    """Before the first batch the loader reads every shard's index: at the 32 requests in
    flight of the shards' reads, 1,000 shards took 31 round trips (1.2 s at 40 ms RTT); the
    indexes (tiny requests) go up to INDEX_CONCURRENCY at once: 100 here in one round."""
    n = 100
    manifest = write_dataset(str(http_server.root / "many"), {"train": [2] * n})
    shards = manifest.split("train").shards
    store = ShardStore(f"{http_server.url}/many")
    together = threading.Barrier(n, timeout=60)  # broken unless all n are in flight at once
    read = type(store)._index_bytes

    def waited(self, shard, expected):
        together.wait()
        return read(self, shard, expected)

    monkeypatch.setattr(type(store), "_index_bytes", waited)
    assert store.ship_indexes(shards)
    assert [len(store.index(s)) for s in shards] == [3] * n  # 2 samples + the end offset
    assert store.stats["requests"] - store.stats["retries"] == n  # each index once
