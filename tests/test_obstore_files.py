"""The obstore transport of S3 reads (``ReadOptions.transport="obstore"``): the loader reads every
sample once through it, obstore's errors are classified as ours (its own retries off: each
attempt is one of ours), and the s3fs ``storage_options`` map onto it with no credential shown.
The outage mid-epoch and the exact-bytes checks run with each transport in
``test_fetch_outage.py`` and ``test_fetch.py`` (the ``s3_transport`` fixture)."""

from __future__ import annotations

import http.server
import pickle
import re
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import classify_by_client, new_bucket
from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.errors import ShardReadError
from wdsloader.format import ShardInfo
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.io.obstore_files import (
    ObjectStoreError,
    ObstoreFiles,
    obstore_config,
    transport_for,
)
from wdsloader.io.transient import is_transient, permanent_failure

obstore = pytest.importorskip("obstore")

COUNTS = [30, 31, 29, 30, 32]
SECRET = "s3cr3t-VALUE-42"


class _Answering(http.server.BaseHTTPRequestHandler):
    """Answers every request with ``status`` and an S3 error body with ``code``."""

    status, code, hits = 503, "SlowDown", [0]

    def do_GET(self) -> None:
        self.hits[0] += 1
        body = f"<Error><Code>{self.code}</Code><Message>m</Message></Error>".encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def answering() -> Iterator[type[_Answering]]:
    """An endpoint on 127.0.0.1 that answers with the status and code set on the yielded class."""
    handler = type("Handler", (_Answering,), {"hits": [0]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _options(endpoint: str, **kw) -> ReadOptions:
    storage = {"key": "AKIDEXAMPLE", "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    return ReadOptions(storage_options=storage, transport="obstore", **kw)


def _error(answering: type[_Answering], status: int, code: str) -> BaseException:
    """The error ObstoreFiles raises for an answer of ``status`` with S3's ``code``."""
    answering.status, answering.code = status, code
    files = ObstoreFiles("s3://bucket/ds", _options(answering.url))  # type: ignore[attr-defined]
    with pytest.raises(BaseException) as info:
        files.cat_file("train/shard-000000.tar", 0, 10)
    return info.value


@pytest.mark.parametrize(
    "status, code, transient",
    [
        (503, "SlowDown", True),
        (500, "InternalError", True),
        (502, "BadGateway", True),
        (429, "TooManyRequests", True),
        (408, "RequestTimeout", True),
        (400, "RequestTimeout", True),  # S3's idle-connection timeout comes as a 400
        (400, "InvalidArgument", False),
        (403, "AccessDenied", False),
        (401, "Unauthorized", False),
        (404, "NoSuchKey", False),
        (416, "InvalidRange", False),
    ],
)
def test_obstore_answers_are_classified_and_tried_once(answering, status, code, transient):
    exc = _error(answering, status, code)
    assert is_transient(exc) is transient, repr(exc)
    assert answering.hits[0] == 1  # obstore's own retries are off: one attempt, one request
    assert SECRET not in repr(exc)
    if status == 404:
        assert isinstance(exc, FileNotFoundError)
    elif status in (401, 403):
        assert isinstance(exc, PermissionError)
    else:
        assert isinstance(exc, ObjectStoreError) and (exc.status, exc.code) == (status, code)


def test_obstore_network_failures_are_transient():
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there: refused
    files = ObstoreFiles("s3://bucket/ds", _options(f"http://127.0.0.1:{port}"))
    with pytest.raises(ConnectionRefusedError, match="Connection refused") as info:
        files.cat_file("train/shard-000000.tar", 0, 10)
    assert is_transient(info.value) and permanent_failure(info.value) is None


def test_a_throttled_read_is_retried_by_us_and_then_names_the_shard(answering):
    """503 SlowDown on every attempt: our retries, each one request, then ShardReadError."""
    answering.status, answering.code = 503, "SlowDown"
    root = "s3://bucket/ds"
    store = ShardStore(root, _options(answering.url, retries=2, backoff=0.0))
    shard = ShardInfo(
        path="train/shard-000003.tar",
        idx_path="train/shard-000003.tar.idx",
        num_samples=4,
        num_bytes=1000,
    )
    with pytest.raises(ShardReadError) as info:
        store.read_ranges([(shard, 0, 100)])
    text = str(info.value)
    assert text.startswith(f"{root}/train/shard-000003.tar: read failed at byte offset 0 after 2 ")
    assert "503 Service Unavailable" in text and SECRET not in text
    assert answering.hits[0] == 3 and store.stats["retries"] == 2


def test_a_denied_read_is_permanent_and_names_the_shard_without_credentials(answering):
    answering.status, answering.code = 403, "AccessDenied"
    root = "s3://bucket/ds"
    store = ShardStore(root, _options(answering.url, retries=5, backoff=0.0))
    shard = ShardInfo(
        path="train/shard-000001.tar",
        idx_path="train/shard-000001.tar.idx",
        num_samples=4,
        num_bytes=1000,
    )
    with pytest.raises(PermissionError) as info:
        store.read_ranges([(shard, 0, 100)])
    assert info.value.filename == f"{root}/train/shard-000001.tar"
    assert str(info.value).startswith("[Errno 13] access denied (PermissionError: ")
    assert "403 Forbidden" in str(info.value) and SECRET not in str(info.value)
    assert answering.hits[0] == 1 and store.stats["retries"] == 0  # not retried


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_reads_every_sample_once_through_obstore(s3_server, num_workers):
    from bench.remote.proxy import LatencyProxy, Profile

    url, options = new_bucket(s3_server, "obstore")
    root = f"{url}/ds"
    manifest = write_dataset(root, {"train": COUNTS}, storage_options=options)
    host, port = s3_server.removeprefix("http://").split(":")
    with LatencyProxy((host, int(port)), Profile("none", 0.0, None)) as proxy:
        via = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
        read = ReadOptions(storage_options=via, transport="obstore", max_request_bytes=8192)
        loader = create_loader(
            root, "train", batch_size=16, num_workers=num_workers, drop_last=False, seed=3,
            read_options=read,
        )  # fmt: skip
        keys = [k for batch in loader for k in batch["__key__"]]
        log = proxy.snapshot(log=True)["log"]
    assert sorted(keys) == [f"train{i:07d}" for i in range(sum(COUNTS))]
    with ShardStore(root, ReadOptions(storage_options=options)) as store:
        spans = [store.index(s) for s in manifest.split("train").shards]
    samples_bytes = sum(int(offsets[-1] - offsets[0]) for offsets in spans)
    got = 0
    for _, _, kind, target, rng in log:
        if kind == "GET-range" and target.split("?")[0].endswith(".tar"):
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
            assert m is not None, rng
            got += int(m[2]) + 1 - int(m[1])
    assert got == samples_bytes  # each byte of each sample once (ranged GETs)
    assert [e[2] for e in log if e[2] in ("HEAD", "LIST")] == ["LIST"]  # no HEAD per shard


# a fresh interpreter: obstore already ran in pytest's process (a fork of it would fall back)
_WORKERS_EPOCH = """
import json, sys
from wdsloader import create_loader
from wdsloader.io import ReadOptions
from wdsloader.stream.options import WorkerOptions
root, storage, context = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
read = ReadOptions(storage_options=storage, transport="obstore", max_request_bytes=8192)
loader = create_loader(
    root, "train", batch_size=16, num_workers=2, drop_last=False, seed=3, read_options=read,
    workers=WorkerOptions(multiprocessing_context=context),
)
batches = iter(loader)
keys = list(next(batches)["__key__"])
clients = sorted({"s3fs", "aiobotocore", "botocore"} & set(sys.modules))  # at the first batch
keys += [k for batch in batches for k in batch["__key__"]]
print(json.dumps([keys, clients]))
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_every_worker_reads_through_obstore_and_every_sample_once(s3_server, monkeypatch, context):
    """A parent process that forks its workers does not start obstore before them (its runtime
    does not survive a fork): it reads the manifest, listing and indexes through obstore in a
    forked helper process; one that spawns them reads them through its own obstore. Neither
    sets up s3fs (nor imports botocore) before its first batch, and each reads the manifest,
    the listing and each index once in all (the workers get them from the parent). Each worker
    starts its own obstore and reads every shard byte through it (obstore's User-Agent on each
    ranged GET of a shard), every sample once."""
    import json
    import os
    import subprocess
    import sys

    from bench.remote import proxy as proxy_module

    classify_by_client(monkeypatch)
    url, options = new_bucket(s3_server, "obstore")
    root = f"{url}/ds"
    manifest = write_dataset(root, {"train": COUNTS}, storage_options=options)
    host, port = s3_server.removeprefix("http://").split(":")
    with proxy_module.LatencyProxy(
        (host, int(port)), proxy_module.Profile("none", 0.0, None)
    ) as proxy:
        via = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        run = subprocess.run(
            [sys.executable, "-c", _WORKERS_EPOCH, root, json.dumps(via), context],
            capture_output=True, text=True, timeout=240, env=env, check=False,
        )  # fmt: skip
        log = proxy.snapshot(log=True)["log"]
    assert run.returncode == 0, run.stderr[-3000:]
    keys, parent_clients = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(keys) == [f"train{i:07d}" for i in range(sum(COUNTS))]
    assert parent_clients == []
    assert {e[2].split()[1] for e in log} == {"obstore"}  # the manifest's GET too
    setup = [e[3].rsplit("/ds/", 1)[-1] for e in log if not e[3].split("?")[0].endswith(".tar")]
    indexes = sorted(s.idx_path for s in manifest.split("train").shards)
    assert sorted(p for p in setup if p.endswith(".wdsidx")) == indexes  # each once in all
    assert sum(p == "manifest.json" for p in setup) == 1
    assert sum(e[2].startswith("LIST") for e in log) == 1
    shard_reads = [e for e in log if e[3].split("?")[0].endswith(".tar")]
    assert {e[2] for e in shard_reads} == {"GET-range obstore"}, {e[2] for e in shard_reads}
    sizes = {s.path: s.num_bytes for s in manifest.split("train").shards}
    assert {e[3].rsplit("/ds/", 1)[1] for e in shard_reads} == set(sizes)  # both workers' shards


def test_a_process_forked_after_obstore_ran_above_it_reads_through_fsspec(monkeypatch, caplog):
    """Its parent's obstore runtime does not survive the fork (a request would hang): the store
    reads through fsspec, with a warning saying why, and obstore itself refuses to start."""
    from wdsloader.io import obstore_files, remote_fs

    monkeypatch.setattr(obstore_files, "_started_in", -1)  # obstore ran in another process
    options = _options("http://127.0.0.1:9")
    with caplog.at_level("WARNING", logger="wdsloader.io.remote_fs"):
        fs, _, final = remote_fs.remote_filesystem("s3://bucket/ds", options, data=True)
    assert not isinstance(fs, ObstoreFiles) and fs.protocol[0] == "s3" and final
    assert "forked after obstore ran in its parent" in caplog.text
    with pytest.raises(RuntimeError, match="obstore made requests in the parent of this forked"):
        ObstoreFiles("s3://bucket/ds", options).cat_file("train/shard-000000.tar", 0, 10)


def test_the_main_process_reads_indexes_through_a_helper_until_its_first_shard_read(monkeypatch):
    """Before its workers start, the main process does not start obstore (a fork of it would
    fall back): indexes and listings go through obstore in a forked helper process (no s3fs),
    shards' bytes through obstore here."""
    from wdsloader.io import obstore_files
    from wdsloader.io.obstore_helper import HelperFiles

    monkeypatch.setattr(obstore_files, "_started_in", None)
    store = ShardStore("s3://bucket/ds", _options("http://127.0.0.1:9"))
    assert isinstance(store._storage().fs, HelperFiles) and obstore_files._started_in is None
    assert isinstance(store._storage(data=True).fs, ObstoreFiles)
    assert isinstance(store._storage().fs, ObstoreFiles)  # then everything through obstore


def test_by_default_s3_shards_are_read_through_obstore_and_an_explicit_choice_wins():
    storage = {"key": "AKID", "secret": SECRET, "client_kwargs": {"endpoint_url": "http://h:9"}}
    assert ReadOptions().transport == "auto"
    store = ShardStore("s3://bucket/ds", ReadOptions(storage_options=storage))
    assert isinstance(store._storage(data=True).fs, ObstoreFiles)
    chosen = ReadOptions(storage_options=storage, transport="fsspec")
    store = ShardStore("s3://bucket/ds", chosen)
    assert type(store._storage(data=True).fs).__name__ == "S3FileSystem"


def test_storage_options_map_and_what_does_not_is_named():
    config, unsupported = obstore_config(
        {
            "key": "AKID",
            "secret": SECRET,
            "token": "tok-123456",
            "client_kwargs": {"endpoint_url": "http://h:9000", "region_name": "eu-west-1"},
            "config_kwargs": {"read_timeout": 5, "s3": {"addressing_style": "path"}},
            "skip_instance_cache": True,
        }
    )
    assert config == {
        "access_key_id": "AKID",
        "secret_access_key": SECRET,
        "session_token": "tok-123456",
        "endpoint": "http://h:9000",
        "region": "eu-west-1",
    }
    assert unsupported == []
    odd = {"secret": SECRET, "s3_additional_kwargs": {"SSECustomerKey": SECRET}, "use_ssl": False}
    assert obstore_config(odd)[1] == ["s3_additional_kwargs", "use_ssl"]
    with pytest.raises(ValueError) as info:
        transport_for("s3://b/ds", "obstore", odd)
    assert str(info.value) == (
        "transport='obstore' cannot read this dataset: storage option(s) s3_additional_kwargs, "
        "use_ssl have no obstore equivalent"
    )
    assert transport_for("s3://b/ds", "auto", odd) == "fsspec"  # auto falls back, silently
    endpoint = {"anon": True, "endpoint_url": "http://127.0.0.1:9000"}
    assert transport_for("s3://b/ds", "auto", endpoint) == "obstore"
    assert transport_for("https://h/ds", "auto", None) == "fsspec"
    with pytest.raises(ValueError, match="reads s3:// roots only, not https:// ones"):
        transport_for("https://h/ds", "obstore", None)
    with pytest.raises(ValueError, match="transport='nope': expected 'auto', 'fsspec' or"):
        ReadOptions(transport="nope")


def test_without_obstore_the_explicit_transport_names_the_extra_and_auto_keeps_s3fs(monkeypatch):
    from wdsloader.io import obstore_files

    monkeypatch.setattr(obstore_files, "obstore_installed", lambda: False)
    endpoint = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    with pytest.raises(ValueError, match=r"not installed \(pip install 'wdsloader\[s3fast\]'\)"):
        transport_for("s3://b/ds", "obstore", endpoint)
    assert transport_for("s3://b/ds", "auto", endpoint) == "fsspec"


def test_auto_reads_through_obstore_only_where_the_region_is_known(monkeypatch, tmp_path):
    """obstore does not look a bucket's region up (s3fs does): auto keeps s3fs without one."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert transport_for("s3://b/ds", "auto", {"anon": True}) == "fsspec"
    region = {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}}
    assert transport_for("s3://b/ds", "auto", region) == "obstore"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert transport_for("s3://b/ds", "auto", {"anon": True}) == "obstore"
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    (tmp_path / "config").write_text("[default]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    assert transport_for("s3://b/ds", "auto", {"anon": True}) == "obstore"


def test_no_credential_in_reprs_or_pickled_state(answering):
    options = _options(answering.url)
    store = ShardStore("s3://bucket/ds", options)
    files = store._storage(data=True).fs
    assert isinstance(files, ObstoreFiles)
    assert repr(files) == "ObstoreFiles('s3://bucket/ds')"
    assert SECRET not in repr(store) and SECRET not in repr(options)
    state = pickle.dumps(store)  # its root and options: the obstore client is rebuilt
    clone = pickle.loads(state)
    assert clone._remote is None and clone.options.transport == "obstore"
    with pytest.raises(TypeError, match="is not pickled"):
        pickle.dumps(files)


class _Serving(http.server.BaseHTTPRequestHandler):
    """Answers each ranged GET with those bytes of ``body`` (sent from a view: the server
    makes no copy of them in this process)."""

    body = memoryview(bytes(range(256)) * 8192)  # 2 MiB

    def do_GET(self) -> None:
        first, last = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers["Range"]).groups()
        a, b = int(first), int(last) + 1
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {a}-{b - 1}/{len(self.body)}")
        self.send_header("Content-Length", str(b - a))
        self.send_header("ETag", '"e"')
        self.send_header("Last-Modified", "Sat, 28 Nov 2026 12:00:00 GMT")
        self.end_headers()
        self.wfile.write(self.body[a:b])

    def log_message(self, *args: object) -> None:
        pass


def test_a_joined_read_through_obstore_copies_each_answer_straight_into_the_buffer():
    """Each answer is copied once, from obstore's buffer into the read's: no Python ``bytes``
    of an answer is made on the way (a copy of every byte, and memory faulted in for it)."""
    import tracemalloc

    import numpy as np

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serving)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    shard = ShardInfo(
        path="train/s.tar",
        idx_path="train/.s.tar.wdsidx",
        num_samples=1,
        num_bytes=len(_Serving.body),
    )
    reqs = [(shard, 0, len(_Serving.body))]
    try:
        with ShardStore("s3://bucket/ds", _options(endpoint, max_request_bytes=1 << 20)) as store:
            store.read_joined([(shard, 0, 10)])  # obstore started
            out = np.zeros(len(_Serving.body), dtype=np.uint8)
            tracemalloc.start()
            try:
                got, _ = store.read_joined(reqs, out)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert bytes(got) == _Serving.body and np.shares_memory(got, out)
    assert peak < 256 * 1024  # before: a bytes copy of each 1 MiB answer
