"""Credentials never reach a message: URL userinfo, auth headers and signed query strings are
redacted in errors (and their tracebacks), log lines, reprs and the command line's output."""

from __future__ import annotations

import logging
import traceback

import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import Faults, http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.errors import ManifestError, ShardReadError
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.redact import RedactingFilter, redact, redact_options, secrets_of

PASSWORD = "hunter2-pass-0xC0FFEE"
TOKEN = "tok-SECRET-7f3a9b"
SIGNATURE = "sig0123456789abcdef"
CREDENTIAL = "AKIAEXAMPLE42%2F20261123%2Fus-east-1"
SESSION = "FwoGZXIvYXdzEXAMPLE"
SECRETS = (PASSWORD, TOKEN, SIGNATURE, CREDENTIAL, SESSION)


# -- the function ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, shown",
    [
        (f"http://bob:{PASSWORD}@h:80/ds/a.tar failed", "http://***@h:80/ds/a.tar failed"),
        (f"https://{TOKEN}@github.com/x", "https://***@github.com/x"),
        (f"s3://k:{PASSWORD}@bucket/p", "s3://***@bucket/p"),
        (
            f"https://b.s3.amazonaws.com/a.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            f"{CREDENTIAL}&X-Amz-Security-Token={SESSION}&X-Amz-Signature={SIGNATURE}",
            "https://b.s3.amazonaws.com/a.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        (
            f"https://a.blob.core.windows.net/c/a.tar?sv=2022-11-02&sig={SIGNATURE}&se=2026",
            "https://a.blob.core.windows.net/c/a.tar?sv=2022-11-02&sig=***&se=2026",
        ),
        (
            f"/a.tar?signature={SIGNATURE}&token={TOKEN}&key={TOKEN}",
            "/a.tar?signature=***&token=***&key=***",
        ),
        (f"'Authorization': 'Bearer {TOKEN}', 'Host': 'h'", "'Authorization': '***', 'Host': 'h'"),
        (f"Authorization: Bearer {TOKEN}\nHost: h", "Authorization: ***\nHost: h"),
        (f"{{'key': 'AKIA1234', 'secret': '{TOKEN}'}}", "{'key': '***', 'secret': '***'}"),
        (f"token={TOKEN} password={PASSWORD}", "token=*** password=***"),
        # ordinary messages are left alone
        ("s3://bucket/ds/train/shard-000001.tar: truncated at byte offset 4000",) * 2,
        ("shard-000001.tar: sample 'k000012' field 'image': not a PNG",) * 2,
        ("a text shorter than 5 tokens: got 3",) * 2,
    ],
)
def test_redact_hides_credentials_and_keeps_the_rest(text, shown):
    assert redact(text) == shown


def test_redact_masks_the_secrets_of_storage_options_wherever_they_appear():
    options = {
        "headers": {"Authorization": f"Bearer {TOKEN}", "Accept": "text/plain"},
        "key": "AKIAEXAMPLE",
        "secret": PASSWORD,
        "client_kwargs": {"endpoint_url": f"http://u:{PASSWORD}@minio:9000"},
        "anon": False,
    }
    secrets = secrets_of(options, f"http://bob:{SIGNATURE}@h/ds")
    assert set(secrets) >= {f"Bearer {TOKEN}", TOKEN, "AKIAEXAMPLE", PASSWORD, SIGNATURE}
    text = f"echo {TOKEN} / AKIAEXAMPLE / {SIGNATURE} / {PASSWORD}"
    assert redact(text, secrets) == "echo *** / *** / *** / ***"
    assert redact_options(options) == {
        "headers": {"Authorization": "***", "Accept": "text/plain"},
        "key": "***",
        "secret": "***",
        "client_kwargs": {"endpoint_url": "http://***@minio:9000"},
        "anon": False,
    }


def test_read_options_and_store_show_no_credentials(tmp_path):
    options = ReadOptions(storage_options={"headers": {"Authorization": f"Bearer {TOKEN}"}})
    assert TOKEN not in repr(options) and "'Authorization': '***'" in repr(options)
    m = write_dataset(str(tmp_path / "ds"), {"train": [3]})
    store = ShardStore(f"http://bob:{PASSWORD}@127.0.0.1:1/ds", options)
    assert (
        store.url(m.splits["train"].shards[0]) == "http://***@127.0.0.1:1/ds/train/shard-000000.tar"
    )
    assert store.root == f"http://bob:{PASSWORD}@127.0.0.1:1/ds"  # what is read is unchanged
    assert PASSWORD not in repr(store) and TOKEN not in repr(store)


# -- failing reads ---------------------------------------------------------------------------------
def _text_of(exc: BaseException, records: list[logging.LogRecord]) -> str:
    shown = "".join(traceback.format_exception(exc))
    # ours at every level, every library's from INFO up (fsspec and botocore log URLs and
    # signed headers at DEBUG: see test_redacting_filter_cleans_other_libraries_debug_lines)
    logged = [
        r.getMessage()
        for r in records
        if r.name.startswith("wdsloader") or r.levelno >= logging.INFO
    ]
    return shown + str(exc) + "\n".join(logged)


@pytest.mark.parametrize("where", ["userinfo", "header", "signed redirect"])
def test_a_failing_read_leaks_no_credential(http_server, caplog, where):
    """A server answering 500 (after 2 retries): the error, its traceback and every log line
    name the shard and the URL, without the password, token or signature."""
    write_dataset(str(http_server.root / "ds"), {"train": [4]})
    root, options = f"{http_server.url}/ds", {}
    if where == "userinfo":
        root = root.replace("http://", f"http://bob:{PASSWORD}@")
    elif where == "header":
        options = {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    query = (
        f"X-Amz-Credential={CREDENTIAL}&X-Amz-Security-Token={SESSION}&X-Amz-Signature={SIGNATURE}"
    )
    http_server.faults = Faults(
        status=500, redirect_query=query if where == "signed redirect" else None
    )
    caplog.set_level(logging.DEBUG)
    loader = create_loader(
        root,
        "train",
        batch_size=2,
        storage_options=options,
        read_options=ReadOptions(retries=2, backoff=0.001),
    )
    with pytest.raises(ShardReadError, match=r"/ds/train/shard-000000\.tar: read failed") as info:
        next(iter(loader))
    shown = _text_of(info.value, caplog.records)
    assert str(info.value).startswith(
        "http://***@127.0.0.1:" if where == "userinfo" else "http://127.0.0.1:"
    )
    assert "500" in str(info.value)
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2
    for secret in SECRETS:
        assert secret not in shown


def test_a_missing_shard_error_leaks_no_password(http_server, caplog):
    m = write_dataset(str(http_server.root / "ds"), {"train": [4]})
    shard = m.splits["train"].shards[0]
    (http_server.root / "ds" / shard.path).unlink()
    root = f"{http_server.url.replace('http://', f'http://bob:{PASSWORD}@')}/ds"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(FileNotFoundError) as info:
        ShardStore(root).read_ranges([(shard, 0, 10)])
    assert (
        info.value.filename
        == f"{http_server.url.replace('http://', 'http://***@')}/ds/{shard.path}"
    )
    assert PASSWORD not in _text_of(info.value, caplog.records)


def test_redacting_filter_cleans_other_libraries_debug_lines(http_server, caplog):
    write_dataset(str(http_server.root / "ds"), {"train": [4]})
    root = f"{http_server.url.replace('http://', f'http://bob:{PASSWORD}@')}/ds"
    caplog.handler.addFilter(RedactingFilter())
    caplog.set_level(logging.DEBUG, logger="fsspec")
    create_loader(root, "train", batch_size=2)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("fsspec")]
    assert f"{http_server.url.replace('http://', 'http://***@')}/ds/manifest.json" in lines
    assert not any(PASSWORD in line for line in lines)


def test_command_line_output_and_errors_show_no_password(http_server, capsys):
    from wdsloader.cli import main

    write_dataset(str(http_server.root / "ds"), {"train": [4]})
    base = http_server.url.replace("http://", f"http://bob:{PASSWORD}@")
    shown = http_server.url.replace("http://", "http://***@")
    assert main(["info", f"{base}/ds"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{shown}/ds: format ")
    assert main(["info", f"{base}/nothing-here"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"wdsloader: error: {shown}/nothing-here/manifest.json: manifest not found"
    )
    for text in (out, err):
        assert PASSWORD not in text


def test_create_loader_manifest_error_shows_no_password(http_server):
    root = f"{http_server.url.replace('http://', f'http://bob:{PASSWORD}@')}/nothing-here"
    with pytest.raises(ManifestError) as info:
        create_loader(root, "train", batch_size=2)
    assert str(info.value).startswith(
        f"{http_server.url.replace('http://', 'http://***@')}/nothing-here/manifest.json: "
    )
    assert PASSWORD not in "".join(traceback.format_exception(info.value))


def test_manifest_load_and_validate_dataset_show_no_password(http_server):
    from wdsloader.format import Manifest
    from wdsloader.validate import validate_dataset

    root = f"{http_server.url.replace('http://', f'http://bob:{PASSWORD}@')}/nothing-here"
    for call in (lambda: Manifest.load(root), lambda: validate_dataset(root)):
        with pytest.raises(ManifestError) as info:
            call()
        assert "http://***@" in str(info.value)
        assert PASSWORD not in "".join(traceback.format_exception(info.value))


def test_build_command_errors_show_no_password(http_server, capsys):
    from build_shards.cli import main

    root = f"{http_server.url.replace('http://', f'http://bob:{PASSWORD}@')}/nothing-here"
    with pytest.raises(SystemExit) as info:
        main(["adopt", root, "--no-progress"])
    assert info.value.code == 2
    shown = http_server.url.replace("http://", "http://***@")
    assert capsys.readouterr().err == f"build-shards: error: {shown}/nothing-here: no such folder\n"


# -- mix sources -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, name",
    [
        (f"http://alice:{PASSWORD}@127.0.0.1:8080/", "127.0.0.1:8080"),
        (f"http://alice:{PASSWORD}@127.0.0.1:8080/data/ds/", "ds"),
        (f"https://{TOKEN}@host.example/ds?X-Amz-Signature={SIGNATURE}#frag", "ds"),
        (f"https://host.example/?token={TOKEN}", "host.example"),
        (f"s3://{PASSWORD}@bucket", "bucket"),
        ("/data/local/ds/", "ds"),
    ],
)
def test_a_sources_default_name_carries_no_userinfo_or_query(url, name):
    from wdsloader.mix import MixSource

    source = MixSource(url, weight=1)
    assert source.name == name
    assert source.url == url  # what is read is unchanged
    for secret in SECRETS:
        assert secret not in repr(source)
    with pytest.raises(ValueError) as info:
        MixSource(url, weight=1, samples=2)
    assert str(info.value).startswith(f"MixSource {redact(url)!r}: give one of weight=")
    assert not any(secret in str(info.value) for secret in SECRETS)


def test_a_source_name_carrying_credentials_is_refused():
    from wdsloader.mix import MixSource

    with pytest.raises(ValueError, match=r"name 'http://\*\*\*@h/x' carries credentials") as info:
        MixSource("/data/ds", weight=1, name=f"http://bob:{PASSWORD}@h/x")
    assert PASSWORD not in str(info.value)


def test_a_mix_over_a_url_with_a_password_shows_it_nowhere(http_server, caplog):
    """The password of a mixed source's URL reaches no stats key, no state (its fingerprint),
    no schema error and no log line."""
    from wdsloader.mix import MixSource

    write_dataset(str(http_server.root), {"train": [4]})  # at the server's root: no path
    write_dataset(str(http_server.root / "b"), {"train": [6]})
    base = http_server.url.replace("http://", f"http://bob:{PASSWORD}@")
    caplog.set_level(logging.DEBUG, logger="wdsloader")
    sources = [MixSource(f"{base}/", repeat=1), MixSource(f"{base}/b", repeat=1)]
    loader = create_loader(sources, "train", 2, seed=1)
    batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == 10
    shown = repr(loader.stats) + repr(loader.state_dict())
    host = http_server.url.removeprefix("http://")
    assert f"samples/{host}" in shown and "samples/b" in shown
    for secret in SECRETS:
        assert secret not in shown
        assert not any(secret in r.getMessage() for r in caplog.records)
