"""The torchrun harness of the distributed tests: each rank's output comes back, a failing rank's
stderr shows in the failure, and a run past its timeout is killed with its ranks."""

from __future__ import annotations

import os
import time

import pytest

from tests.torchrun_harness import run_torchrun, start_torchrun

pytestmark = pytest.mark.slow

SCRIPT = """
import os, sys, threading
rank = os.environ["RANK"]
print(f"out of rank {rank} of {os.environ['WORLD_SIZE']}: {sys.argv[1:]}")
print(f"err of rank {rank}", file=sys.stderr)
if rank == os.environ.get("FAIL_RANK"):
    raise SystemExit(f"rank {rank} fails on purpose")
if os.environ.get("HANG"):
    open(f"pid{rank}.part", "w").write(str(os.getpid()))
    os.rename(f"pid{rank}.part", f"pid{rank}")
    threading.Event().wait()
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "ranks.py"
    path.write_text(SCRIPT)
    return path


def test_each_ranks_stdout_comes_back(script, tmp_path):
    outs = run_torchrun(script, "--x", "1", nproc=3, cwd=tmp_path)
    assert outs == [f"out of rank {r} of 3: ['--x', '1']\n" for r in range(3)]


def test_a_failing_rank_shows_every_ranks_stderr(script, monkeypatch):
    monkeypatch.setenv("FAIL_RANK", "1")
    with pytest.raises(AssertionError) as err:
        run_torchrun(script, nproc=2)
    text = str(err.value)
    assert "--- local rank 0 stderr:\nerr of rank 0\n" in text
    assert "--- local rank 1 stderr:\nerr of rank 1\nrank 1 fails on purpose" in text
    assert "--- torchrun (exit 1):" in text


def test_a_run_past_its_timeout_is_stopped_with_its_ranks(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HANG", "1")
    # a timeout shorter than the ranks' start: the run is past it once both ranks hang (the
    # harness counts it from the launch), so the test waits for no idle time of its own
    launch = start_torchrun(script, nproc=2, cwd=tmp_path, timeout=2)
    pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
    ready = time.monotonic() + 180
    while not all(p.exists() for p in pid_files):  # until both ranks hang
        assert launch.proc.poll() is None and time.monotonic() < ready, "the ranks never started"
        time.sleep(0.05)
    with pytest.raises(AssertionError) as err:
        launch.wait()
    assert str(err.value).startswith("torchrun ran past 2 s\n--- torchrun (exit ")
    assert "err of rank 0" in str(err.value) and "err of rank 1" in str(err.value)
    assert launch.proc.returncode is not None
    for pid_file in pid_files:  # each rank (in a session of its own) is gone too
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
