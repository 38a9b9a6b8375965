"""One build at a time per output folder: a second build is refused and touches nothing; the
lock of a dead build is taken over and its build resumed."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from build_shards import OutputLockedError, build_shards
from build_shards.commit.lock import LOCK_NAME, BuildLock
from tests.test_build_core import gen_samples, read_dataset
from wdsloader.io.storage import join, url_to_fs

pytestmark = pytest.mark.usefixtures("infer_first_sample_only")
OPTS = dict(shard_max_count=5, block_size=10, splits={"train": 0.7, "val": 0.3})


class HeldSource:
    """A generator of ``n`` samples that stops before item ``at`` until :attr:`go` is set (and
    says so through :attr:`reached`): a build held in its middle."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at
        self.reached, self.go = threading.Event(), threading.Event()

    def __iter__(self):
        for i, sample in enumerate(gen_samples(self.n)):
            if i == self.at:
                self.reached.set()
                assert self.go.wait(30), "the test never released the held build"
            yield sample


def snapshot(url: str) -> dict[str, bytes]:
    """Every file under ``url`` with its bytes."""
    fs, root = url_to_fs(url)
    fs.invalidate_cache()
    return {p: fs.cat_file(p) for p in sorted(fs.find(root))}


def assert_checksums(url: str) -> None:
    manifest, _ = read_dataset(url)
    fs, root = url_to_fs(url)
    for split in manifest.splits.values():
        for shard in split.shards:
            assert hashlib.sha256(fs.cat_file(join(root, shard.path))).hexdigest() == shard.sha256


@pytest.fixture(params=["local", "memory"])
def output(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "ds")
        return
    url = f"memory://lock-{uuid.uuid4().hex[:8]}/ds"
    yield url
    fs, root = url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_a_second_build_during_a_build_is_refused_and_touches_nothing(output):
    held = HeldSource(80, at=50)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            build_shards(iter(held), output, **OPTS)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.reached.wait(30)
        before = snapshot(output)
        assert any("/_build/block-" in p for p in before)  # finished blocks to destroy
        holder = rf"host {socket.gethostname()}, pid \d+, started .*"
        # the same options (the same fingerprint: it would resume the running build) ...
        with pytest.raises(
            OutputLockedError, match=rf"{re.escape(output)} is being written .*{holder}"
        ):
            build_shards(iter(list(gen_samples(80))), output, **OPTS)
        # ... other data with overwrite ...
        with pytest.raises(OutputLockedError, match="the same build") as info:
            build_shards(gen_samples(80), output, **OPTS)
        assert "pass lock=LockOptions(break_lock=True)" in str(info.value)
        with pytest.raises(OutputLockedError, match=f"{re.escape(output)} is being written"):
            build_shards(list(gen_samples(30, start=500)), output, overwrite=True)
        assert snapshot(output) == before
    finally:
        held.go.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    manifest, data = read_dataset(output)
    assert manifest.num_samples == 80
    assert sorted(k for split in data.values() for k in split) == [f"s{i:06d}" for i in range(80)]
    assert_checksums(output)
    assert not any(LOCK_NAME in p or "/_build" in p for p in snapshot(output))


def _held_build(output: str, reached, go) -> None:
    """A build in another process, held before item 50 until ``go`` is set."""
    from build_shards.probe import infer

    infer.INFER_ROWS = 1  # this process's build: see the infer_first_sample_only fixture

    def samples():
        for i, sample in enumerate(gen_samples(80)):
            if i == 50:
                reached.set()
                assert go.wait(30)
            yield sample

    build_shards(samples(), output, **OPTS)


def test_a_build_in_another_process_is_refused_too(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    reached, go = ctx.Event(), ctx.Event()
    out = str(tmp_path / "ds")
    proc = ctx.Process(target=_held_build, args=(out, reached, go))
    proc.start()
    try:
        assert reached.wait(60)
        before = snapshot(out)
        with pytest.raises(OutputLockedError, match=rf"pid {proc.pid}, started"):
            build_shards(list(gen_samples(10, start=900)), out, overwrite=True)
        assert snapshot(out) == before
    finally:
        go.set()
        proc.join(60)
    assert proc.exitcode == 0
    manifest, _ = read_dataset(out)
    assert manifest.num_samples == 80
    assert_checksums(out)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(path, **fields) -> None:
    body = {
        "fingerprint": "f" * 64,
        "host": socket.gethostname(),
        "pid": _dead_pid(),
        "started": time.time(),
        "token": uuid.uuid4().hex,
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def test_the_lock_of_a_crashed_build_on_this_host_is_taken_over_and_the_build_resumed(
    tmp_path, caplog
):
    out = tmp_path / "ds"
    with pytest.raises(OSError, match="went away"):
        build_shards(_failing(60, at=45), out, **OPTS)
    kept = sorted(p.name for p in (out / "_build").glob("block-*.json"))
    assert kept == ["block-00000.json", "block-00001.json", "block-00002.json", "block-00003.json"]
    # the finished blocks' full shards (their small remainders are packed at the end)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*.tar")}
    assert len(stamps) >= 4
    _write_lock(out / LOCK_NAME)  # as a SIGKILLed build leaves it
    with caplog.at_level("WARNING", logger="build_shards"):
        m = build_shards(gen_samples(60), out, **OPTS)
    assert "taking over the lock" in caplog.text and "is gone" in caplog.text
    assert m.num_samples == 60
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # blocks kept, not redone
    assert not (out / LOCK_NAME).exists()


def _failing(n: int, at: int):
    for i, sample in enumerate(gen_samples(n)):
        if i == at:
            raise OSError(f"input went away at item {i}")
        yield sample


def test_a_live_or_foreign_lock_is_held_until_timeout_or_break_lock(tmp_path, caplog):
    out = tmp_path / "ds"
    lock = out / LOCK_NAME
    # a live process of this host (pytest's parent) holds it: refused, whatever its age
    _write_lock(lock, pid=os.getppid(), started=time.time() - 10**6)
    with pytest.raises(OutputLockedError, match=r"pid \d+, started 20\d\d-"):
        build_shards(list(gen_samples(5)), out, lock_timeout=None)
    # another host: held while younger than lock_timeout
    _write_lock(lock, host="elsewhere.example", pid=4242, started=time.time() - 100)
    with pytest.raises(OutputLockedError, match="host elsewhere.example, pid 4242"):
        build_shards(list(gen_samples(5)), out, lock_timeout=3600)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written
    with caplog.at_level("WARNING", logger="build_shards"):
        assert build_shards(list(gen_samples(5)), out, lock_timeout=50).num_samples == 5
    assert "no activity for 10" in caplog.text and "lock_timeout=50" in caplog.text
    # break_lock takes a fresh lock
    _write_lock(lock, host="elsewhere.example", pid=4242)
    m = build_shards(list(gen_samples(7)), out, overwrite=True, break_lock=True)
    assert m.num_samples == 7 and not lock.exists()


def test_a_build_whose_lock_was_broken_does_not_write_its_manifest(tmp_path):
    out = tmp_path / "ds"
    held = HeldSource(40, at=25)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            build_shards(iter(held), out, **OPTS)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.reached.wait(30)
        _write_lock(out / LOCK_NAME, host="elsewhere.example")  # someone broke and took it
    finally:
        held.go.set()
        thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], OutputLockedError), errors
    assert "taken over by another build" in str(errors[0])
    assert not (out / "manifest.json").exists()
    assert (out / LOCK_NAME).exists()  # the other build's lock stays


def test_the_lock_is_an_exclusive_create_on_s3(s3_bucket):
    url, options = s3_bucket
    fs, root = url_to_fs(f"{url}/ds", options)
    first = BuildLock(fs, root, f"{url}/ds", fingerprint="a" * 64)
    first.acquire()
    try:
        rival = BuildLock(fs, root, f"{url}/ds", fingerprint="b" * 64, timeout=None)
        with pytest.raises(OutputLockedError, match=f"{re.escape(url)}/ds is being written"):
            rival.acquire()
        with pytest.raises(OutputLockedError, match="is being written"):
            build_shards(
                [{"x": np.arange(3)}] * 4, f"{url}/ds", storage_options=options, lock_timeout=None
            )
    finally:
        first.release()
    assert not fs.exists(join(root, LOCK_NAME))
    m = build_shards([{"x": np.arange(3)}] * 4, f"{url}/ds", storage_options=options)
    assert m.num_samples == 4
