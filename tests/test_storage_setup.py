"""S3 set-up mistakes are one line naming the URL and what to check, in the library (a
StorageSetupError) and the command lines (stderr, exit 2, no traceback), never a credential: a
build into a missing bucket (moto's server on loopback) and a dead endpoint (a loopback port
nobody listens on)."""

from __future__ import annotations

import json
import socket
import uuid

import pytest

from build_shards import adopt, build_shards
from tests.conftest import new_bucket
from wdsloader import create_loader
from wdsloader.errors import StorageSetupError
from wdsloader.format import Manifest

KEY = "AKIA-SETUP-KEY-0001"
SECRET = "setup-SECRET-never-shown"
FAST = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}  # botocore's 5 tries: slow


def _options(endpoint: str) -> dict:
    return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}, **FAST}


def _cli_options(endpoint: str) -> list[str]:
    pairs = [f"key={KEY}", f"secret={SECRET}", f"client_kwargs.endpoint_url={endpoint}"]
    pairs.append("config_kwargs.retries.total_max_attempts=1")
    return [arg for pair in pairs for arg in ("--storage-option", pair)]


@pytest.fixture()
def dead_endpoint() -> str:
    """``http://127.0.0.1:PORT`` where nothing listens (the port was free a moment ago)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


def _missing_bucket(endpoint: str, bucket: str) -> str:
    return (
        f"s3://{bucket}/ds: the bucket '{bucket}' does not exist at {endpoint}: check the "
        "bucket name and the endpoint (storage option client_kwargs.endpoint_url), or create "
        "the bucket"
    )


def _dead(url: str, endpoint: str, message: str) -> None:
    """``message`` is the one line for a dead endpoint; the client's error class in it is
    s3fs's (botocore) or obstore's, whichever transport read."""
    head = f"{url}: cannot connect to the storage endpoint {endpoint} ("
    tail = (
        "): check the endpoint URL (storage option client_kwargs.endpoint_url) and that the "
        "server is running and reachable from here"
    )
    assert message.startswith(head) and message.endswith(tail), message
    assert message[len(head) : -len(tail)] in ("EndpointConnectionError", "ConnectionRefusedError")


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert KEY not in text and SECRET not in text


def test_a_build_into_a_missing_bucket_is_one_line_naming_the_bucket(s3_server, tmp_path, capsys):
    from build_shards.cli import main

    new_bucket(s3_server)  # the server holds other buckets, not this one
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    rows = [{"__key__": f"k{i}", "v": i} for i in range(4)]
    with pytest.raises(StorageSetupError) as info:
        build_shards(rows, f"s3://{bucket}/ds", storage_options=_options(s3_server))
    assert str(info.value) == _missing_bucket(s3_server, bucket)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"v": i}) for i in range(4)))
    argv = ["build", str(data), "-o", f"s3://{bucket}/ds", "--no-progress"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv + _cli_options(s3_server))
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err == f"build-shards: error: {_missing_bucket(s3_server, bucket)}\n"
    _no_secret(str(info.value), out, err)


def test_reading_from_a_dead_endpoint_is_one_line_naming_the_endpoint(dead_endpoint, capsys):
    from wdsloader.cli import main

    manifest = "s3://bucket/ds/manifest.json"
    for call in (
        lambda: Manifest.load("s3://bucket/ds", _options(dead_endpoint)),
        lambda: create_loader(
            "s3://bucket/ds", "train", 2, storage_options=_options(dead_endpoint)
        ),
    ):
        with pytest.raises(StorageSetupError) as info:
            call()
        _dead(manifest, dead_endpoint, str(info.value))
        _no_secret(str(info.value))
    assert main(["info", "s3://bucket/ds", *_cli_options(dead_endpoint)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("wdsloader: error: ") and err.endswith("\n")
    _dead(manifest, dead_endpoint, err.removeprefix("wdsloader: error: ")[:-1])


def test_building_or_adopting_at_a_dead_endpoint_is_one_line(dead_endpoint, tmp_path, capsys):
    from build_shards.cli import main

    rows = [{"__key__": f"k{i}", "v": i} for i in range(4)]
    with pytest.raises(StorageSetupError) as info:
        build_shards(rows, "s3://bucket/ds", storage_options=_options(dead_endpoint))
    _dead("s3://bucket/ds", dead_endpoint, str(info.value))
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"v": i}) for i in range(4)))
    with pytest.raises(StorageSetupError) as info:  # was botocore's EndpointConnectionError
        adopt("s3://bucket/ds", storage_options=_options(dead_endpoint))
    _dead("s3://bucket/ds", dead_endpoint, str(info.value))
    for argv in (
        ["build", str(data), "-o", "s3://bucket/ds", "--no-progress"],
        ["adopt", "s3://bucket/ds", "--no-progress"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv + _cli_options(dead_endpoint))
        assert exit_info.value.code == 2
        out, err = capsys.readouterr()
        assert err.startswith("build-shards: error: ") and err.endswith("\n")
        _dead("s3://bucket/ds", dead_endpoint, err.removeprefix("build-shards: error: ")[:-1])
        _no_secret(out, err)


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    meta = {"HTTPStatusCode": status}
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": meta}, "GetObject")  # type: ignore[arg-type]


def test_credential_mistakes_are_one_line_and_other_errors_are_left_alone():
    from botocore.exceptions import NoCredentialsError

    from wdsloader.io.setup_errors import setup_error

    url = "s3://bucket/ds/manifest.json"
    options = _options("http://127.0.0.1:9")
    refused = PermissionError("denied")
    refused.__cause__ = _client_error("InvalidAccessKeyId", 403)
    assert str(setup_error(refused, url, options)) == (
        f"{url}: http://127.0.0.1:9 refused the credentials (InvalidAccessKeyId): check the "
        "key and secret (storage options key and secret, AWS_* variables or profile) and the "
        "bucket's policy"
    )
    assert str(setup_error(NoCredentialsError(), "s3://bucket/ds", {})).startswith(
        "s3://bucket/ds: no credentials for "
    )
    missing_key = FileNotFoundError("key")
    missing_key.__cause__ = _client_error("NoSuchKey", 404)
    for other in (missing_key, ValueError("x"), TimeoutError("silent server")):
        assert setup_error(other, url, options) is None


def test_an_s3_input_at_a_dead_endpoint_is_named_not_the_output(
    dead_endpoint, tmp_path, capsys, monkeypatch
):
    """The input's set-up mistake named the output folder ('ds: cannot connect to the storage
    endpoint the local filesystem') in the CLI, and was a raw botocore error in the library."""
    from build_shards.cli import main

    for name, value in (
        ("AWS_ACCESS_KEY_ID", KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_ENDPOINT_URL", dead_endpoint),
        ("AWS_MAX_ATTEMPTS", "1"),
    ):
        monkeypatch.setenv(name, value)
    source = "s3://inputs/rows.jsonl"
    with pytest.raises(StorageSetupError) as info:
        build_shards(source, tmp_path / "ds")
    _dead(source, dead_endpoint, str(info.value))
    with pytest.raises(SystemExit) as exit_info:
        main(["build", source, "-o", str(tmp_path / "ds"), "--no-progress"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err.startswith("build-shards: error: ") and err.endswith("\n")
    _dead(source, dead_endpoint, err.removeprefix("build-shards: error: ")[:-1])
    _no_secret(str(info.value), out, err)
    assert not (tmp_path / "ds" / "manifest.json").exists()
