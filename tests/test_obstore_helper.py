"""The forked helper that serves a main process's reads before its workers fork
(wdsloader.io.obstore_helper): its answers, its errors as the main process classifies them, a
helper that dies, and no credential in what it shows. Its use by create_loader (no s3fs in a
parent that forks workers, each index read once) is tested in test_obstore_files.py."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from wdsloader.io import ReadOptions, obstore_helper
from wdsloader.io.obstore_files import ObjectStoreError
from wdsloader.io.obstore_helper import HelperFiles
from wdsloader.io.transient import is_transient

SECRET = "s3cr3t-VALUE-42"


class _FakeFiles:
    """Stands for ObstoreFiles in the helper (it is forked with this class in place)."""

    def __init__(self, root: str, options: ReadOptions) -> None:
        self.root = root

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        if path == "hang":
            threading.Event().wait()  # stuck (never answers)
        if path == "die":
            os._exit(3)  # the helper dies mid-call
        if path == "gone":
            raise FileNotFoundError(errno.ENOENT, f"{self.root}/{path}: not found")
        if path == "busy":
            raise ObjectStoreError("the server is busy", 503, "SlowDown")
        if path == "reset":
            raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")
        return bytes(range(256))[start or 0 : end]

    def info(self, path: str) -> dict:
        return {"name": path, "size": 7, "type": "file"}

    def ls(self, path: str, detail: bool = True) -> list[dict]:
        return [{"name": f"{path}/a.tar", "size": 3, "type": "file"}]


@pytest.fixture
def helper(monkeypatch):
    monkeypatch.setattr(obstore_helper, "ObstoreFiles", _FakeFiles)
    storage = {"key": "AKIDEXAMPLE", "secret": SECRET, "client_kwargs": {"endpoint_url": "x"}}
    files = HelperFiles("s3://bucket/ds", ReadOptions(storage_options=storage))
    yield files
    files.close()


def test_the_helper_answers_each_call_with_what_obstore_read(helper):
    assert helper.cat_file("train/a.tar", 10, 14) == bytes([10, 11, 12, 13])
    assert helper.cat_file("train/a.tar", 250) == bytes(range(250, 256))
    assert helper.info("train/a.tar") == {"name": "train/a.tar", "size": 7, "type": "file"}
    assert helper.ls("train") == [{"name": "train/a.tar", "size": 3, "type": "file"}]
    assert helper.forks == 1  # one helper for every call
    assert SECRET not in repr(helper) and repr(helper) == "HelperFiles('s3://bucket/ds')"


def test_its_errors_reach_the_caller_as_the_errors_retries_classify(helper):
    with pytest.raises(FileNotFoundError) as missing:
        helper.cat_file("gone")
    assert missing.value.errno == errno.ENOENT and not is_transient(missing.value)
    assert str(missing.value) == "[Errno 2] s3://bucket/ds/gone: not found"
    with pytest.raises(ObjectStoreError) as busy:
        helper.cat_file("busy")
    assert (busy.value.status, busy.value.code) == (503, "SlowDown") and is_transient(busy.value)
    with pytest.raises(ConnectionResetError) as reset:
        helper.cat_file("reset")
    assert is_transient(reset.value)
    assert helper.forks == 1  # an error is an answer: the helper goes on


def test_a_helper_that_dies_fails_its_call_as_transient_and_the_next_call_forks_another(helper):
    with pytest.raises(ConnectionError) as died:
        helper.cat_file("die")
    assert is_transient(died.value)
    assert "HelperFiles('s3://bucket/ds'): the obstore helper process exited" in str(died.value)
    assert helper.cat_file("train/a.tar", 0, 2) == b"\x00\x01"
    assert helper.forks == 2


def test_it_is_not_pickled_and_a_forked_child_does_not_use_its_parents_helper(helper):
    import pickle

    with pytest.raises(TypeError, match="is not pickled"):
        pickle.dumps(helper)
    assert helper.cat_file("train/a.tar", 0, 1) == b"\x00"
    pid = os.fork()
    if pid == 0:  # the child: the parent's helper is not its own
        try:
            helper.cat_file("train/a.tar", 0, 1)
            code = 1
        except RuntimeError as exc:
            code = 0 if "belongs to the process that made it" in str(exc) else 2
        os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert helper.cat_file("train/a.tar", 1, 2) == b"\x01" and helper.forks == 1


def test_an_idle_helper_exits_and_the_next_call_forks_another(helper, monkeypatch):
    import time

    from wdsloader.io import obstore_helper

    monkeypatch.setattr(obstore_helper, "IDLE_S", 0.05)  # the helper is forked with it
    assert helper.cat_file("train/a.tar", 0, 1) == b"\x00"
    pid = helper._helper
    deadline = time.monotonic() + 60
    while helper._helper == pid and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for its goodbye (it exits on its own)
    assert helper._helper is None  # it said goodbye and was reaped
    assert helper.cat_file("train/a.tar", 2, 3) == b"\x02" and helper.forks == 2


def test_a_call_with_no_answer_by_the_deadline_times_out_and_a_new_helper_answers(monkeypatch):
    """A stuck helper fails its call at the read deadline (a transient timeout, no hang); it is
    killed, and the next call forks another."""
    monkeypatch.setattr(obstore_helper, "ObstoreFiles", _FakeFiles)
    files = HelperFiles("s3://bucket/ds", ReadOptions(deadline=0.5))
    try:
        with pytest.raises(TimeoutError) as late:
            files.cat_file("hang")
        assert str(late.value) == (
            "[Errno 110] HelperFiles('s3://bucket/ds'): no answer from the obstore helper in 0.5 s"
        )
        assert is_transient(late.value)
        files._options = ReadOptions()  # the default deadline: a loaded machine forks slowly
        assert files.cat_file("train/a.tar", 3, 4) == b"\x03" and files.forks == 2
    finally:
        files.close()
