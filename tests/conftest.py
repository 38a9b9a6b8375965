"""Shared fixtures: a real S3 endpoint on loopback (moto's server mode) read through s3fs."""

from __future__ import annotations

import logging
import sys
import uuid

import pytest


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1; yields its endpoint URL."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per S3 request

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def new_bucket(endpoint: str, prefix: str = "test") -> tuple[str, dict]:
    """``(bucket_url, storage_options)`` for a fresh bucket on the S3 server at ``endpoint``."""
    import s3fs

    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint},
        "skip_instance_cache": True,
    }
    bucket = f"{prefix}-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(bucket)
    return f"s3://{bucket}", options


def classify_by_client(monkeypatch) -> None:
    """Make the latency proxy (bench/remote/proxy.py) count each request as its kind plus
    ``obstore`` (obstore's User-Agent) or ``other``, for tests that check which client asked."""
    from bench.remote import proxy as proxy_module

    plain = proxy_module.classify

    def by_client(head: bytes) -> str:
        client = "obstore" if b"\nuser-agent: object_store/" in head.lower() else "other"
        return f"{plain(head)} {client}"

    monkeypatch.setattr(proxy_module, "classify", by_client)


@pytest.fixture()
def build_workers(monkeypatch):
    """A build that asks for worker processes starts them however small it is (the rule that
    runs a small build in one process has its own tests in test_build_workers.py)."""
    monkeypatch.setattr("build_shards.engines.local.SMALL_BUILD_S", 0.0)


@pytest.fixture(params=["fsspec", "obstore"])
def s3_transport(request):
    """Each transport of S3 reads in turn (``ReadOptions.transport``; obstore's skipped where
    it is not installed)."""
    if request.param == "obstore":
        pytest.importorskip("obstore")
    return request.param


@pytest.fixture()
def s3_bucket(s3_server):
    """``(bucket_url, storage_options)`` for a fresh bucket on the loopback S3 server."""
    return new_bucket(s3_server)


@pytest.fixture
def infer_first_sample_only(monkeypatch):
    """Builds whose source fails, pauses or kills the build part-way: their schema comes from
    the first sample only, so that the build's read-ahead for the schema
    (:mod:`build_shards.probe.infer`) does not meet that point before any block is written."""
    from build_shards.probe import infer

    monkeypatch.setattr(infer, "INFER_ROWS", 1)


@pytest.fixture(scope="session")
def ddp_reports(request, tmp_path_factory) -> dict[str, list[dict]]:
    """{module name: its reports, one per rank} of the tests under DDP this session runs (the
    modules whose tests use this fixture), from launches they share (tests/ddp_launch.py): one
    torchrun for their first phases, one for their resumes."""
    from tests.ddp_launch import run_phases

    names = sorted(
        {
            item.module.__name__
            for item in request.session.items
            if "ddp_reports" in getattr(item, "fixturenames", ())
        }
    )
    folders = {name: tmp_path_factory.mktemp(name.rsplit(".", 1)[1]) for name in names}
    return run_phases(folders)


@pytest.fixture(scope="session")
def _ray_shut_down_at_the_end():
    """Shuts down the session's Ray (``local_ray``) after the last test, if one runs."""
    yield
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


@pytest.fixture()
def local_ray(_ray_shut_down_at_the_end):
    """The session's local Ray of 2 CPUs (80 MiB of object store), started by the first test
    that asks for it and kept for the next (a start costs seconds of CPU on a 2-core machine);
    a test that shuts it down leaves the next one a new Ray."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20
        )
    return ray


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = own_rays_after_local_ray(items)


def own_rays_after_local_ray(items: list) -> list:
    """``items`` with the tests that start Ray clusters of their own (fixture
    ``without_local_ray``) moved to just after the last test of the session's Ray
    (``local_ray``), so that the session starts that Ray once; the rest keep their order."""
    own = [item for item in items if "without_local_ray" in getattr(item, "fixturenames", ())]
    moved = set(map(id, own))
    rest = [item for item in items if id(item) not in moved]
    users = [k for k, item in enumerate(rest) if "local_ray" in getattr(item, "fixturenames", ())]
    at = users[-1] + 1 if users else len(rest)
    return rest[:at] + own + rest[at:]


@pytest.fixture()
def without_local_ray():
    """No Ray in this process for the test (it connects to a cluster of its own): the session's
    Ray, if one runs, is shut down (the next test of ``local_ray`` starts a new one)."""
    ray = pytest.importorskip("ray")
    ray.shutdown()
