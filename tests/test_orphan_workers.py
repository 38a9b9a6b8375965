"""DataLoader worker processes do not outlive the training process: killed with SIGKILL (or
crashed, or OOM-killed: nothing of it runs at its end), its workers exit on their own, also a
worker blocked in a read from a server that never answers; thread workers are threads of the
training process and die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from tests.http_server import Faults, RangeHTTPServer
from wdsloader.stream.parent_watch import _gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

REPO = Path(__file__).resolve().parents[1]
EXIT_WITHIN_S = 20.0  # generous on a loaded machine: an orphan lives forever in the stall case

# Made in a fresh interpreter: a loader with 2 workers; the first batch asked for (on a thread:
# in the stall case it never comes), then the worker pids printed once the workers run.
CHILD = """
import json, multiprocessing, sys, threading, time
from wdsloader import WorkerOptions, create_loader
from wdsloader.io import ReadOptions

root, mode, wait, context = sys.argv[1], sys.argv[2], sys.argv[3] == "batch", sys.argv[4]
workers = WorkerOptions(mode=mode, multiprocessing_context=None if context == "-" else context)
loader = create_loader(
    root, "train", batch_size=4, num_workers=2, shuffle=False, workers=workers,
    read_options=ReadOptions(read_timeout=600.0, deadline=None),
)
got, it = threading.Event(), iter(loader)  # kept: a dropped iterator stops its workers
def first():
    next(it)
    got.set()
threading.Thread(target=first, daemon=True).start()
if wait and not got.wait(300):
    sys.exit("no first batch")
deadline = time.monotonic() + 300
while mode == "process" and len(multiprocessing.active_children()) < 2:
    assert time.monotonic() < deadline, "no workers"
    time.sleep(0.01)
print(json.dumps([p.pid for p in multiprocessing.active_children()]), flush=True)
while True:
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """8 shards of 50 samples, in a folder a test may serve over HTTP."""
    root = tmp_path_factory.mktemp("orphans") / "www"
    items = [{"__key__": f"k{i:04d}", "vec": np.full(16, i, np.float32)} for i in range(400)]
    build_shards(items, root, splits={"train": 1.0}, shards=ShardOptions(max_count=50))
    return root


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (to tell it from a later one given the same pid), or
    None when it is gone or a zombie (exited, not yet reaped by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _connected(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP connection to ``127.0.0.1:port`` (only shard
    reads go to the server from a worker; the server never answers them)."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        return False
    inodes = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
    return any(int(row[2].split(":")[1], 16) == port and row[9] in inodes for row in rows)


def _kill_parent_and_wait(child: subprocess.Popen[str], pids: list[int]) -> list[int]:
    """SIGKILL ``child``, then the pids among ``pids`` still running ``EXIT_WITHIN_S`` later
    (any left are killed: no test leaves an orphan behind)."""
    started = {pid: _started(pid) for pid in pids}
    assert None not in started.values(), "a worker was gone before its parent was killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + EXIT_WITHIN_S
    running = list(pids)
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if _started(pid) == started[pid]]
        time.sleep(0.05)  # a poll under the deadline above
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    return running


def _start(
    root: str, mode: str, wait: str, context: str = "-"
) -> tuple[subprocess.Popen[str], list[int]]:
    """The training script over ``root``, and its worker pids (``wait``: "batch" after the
    first batch, "start" once the workers run; ``context``: their start method, "-" default)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, root, mode, wait, context],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    line = child.stdout.readline() if child.stdout else ""
    if not line:
        child.kill()
        pytest.fail(f"the training script failed: {child.communicate()[1]}")
    return child, json.loads(line)


def test_idle_workers_exit_when_the_training_process_is_killed(shards):
    """One batch taken, the workers idle with their prefetched batches: all gone soon after the
    training process is SIGKILLed."""
    child, pids = _start(str(shards), "process", "batch")
    try:
        assert len(pids) == 2
        assert _kill_parent_and_wait(child, pids) == []
    finally:
        child.kill()
        child.communicate()


def test_thread_workers_leave_no_process_to_orphan(shards):
    """``WorkerOptions(mode="thread")``: the workers are threads of the training process, no
    process is started (so none survives it)."""
    child, pids = _start(str(shards), "thread", "batch")
    try:
        assert pids == []
    finally:
        child.kill()
        child.communicate()


@pytest.mark.parametrize("context", ["-", "spawn"])
def test_workers_blocked_in_a_stalled_read_exit_when_the_training_process_is_killed(
    shards, context
):
    """The server accepts the workers' shard reads and never answers (no read deadline: the
    read would wait for ever): the workers blocked in those reads exit all the same once the
    training process is SIGKILLed."""
    with RangeHTTPServer(shards) as server:
        server.faults = Faults(stall="answer")
        child, pids = _start(server.url, "process", "start", context)
        try:
            assert len(pids) == 2
            port = int(server.url.rsplit(":", 1)[1])
            deadline = time.monotonic() + 120.0
            while not (  # the workers' first shard reads are under way, never answered
                sum(r.path.endswith(".tar") for r in server.requests()) >= 2
                and all(_connected(pid, port) for pid in pids)
            ):
                assert time.monotonic() < deadline, f"no stalled read: {server.requests()}"
                time.sleep(0.05)  # a poll under the deadline above
            assert _kill_parent_and_wait(child, pids) == []
        finally:
            child.kill()
            child.communicate()


def test_a_worker_sees_its_parent_gone_also_when_its_starter_is_not_its_parent():
    """Under forkserver a worker's parent is the fork server, not the training process that
    started it: the training process's end counts too (also one that ended before the watch
    began); a living parent and starter do not."""
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()  # reaped: its pid names no process
    assert not _gone(os.getppid(), None)
    assert not _gone(os.getppid(), os.getpid())
    assert _gone(os.getppid(), ended.pid)
    assert _gone(os.getppid() + 1, None)


def test_a_starter_that_ended_and_was_not_reaped_counts_as_gone():
    """A training process that ended is a zombie until its own parent waits for it (a launcher
    that does not wait): its forkserver workers see it gone all the same."""
    zombie = subprocess.Popen([sys.executable, "-c", ""])
    try:
        deadline = time.monotonic() + 60.0
        while _started(zombie.pid) is not None:  # None: a zombie, as it is not waited for
            assert time.monotonic() < deadline, "the process did not end"
            time.sleep(0.01)  # a poll under the deadline above
        assert _gone(os.getppid(), zombie.pid)
    finally:
        zombie.wait()
