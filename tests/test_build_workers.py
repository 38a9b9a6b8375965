"""Build worker processes: a dead worker surfaces within seconds as one clear BuildWorkerError
(naming the block, keeping the finished ones), and a script without a ``__main__`` guard gets
told to add one instead of hanging or printing pages of tracebacks."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from build_shards import BuildWorkerError, build_shards
from build_shards.pool import refuse_reimported_main
from wdsloader.errors import SchemaError
from wdsloader.format import Manifest

REPO = Path(__file__).resolve().parents[1]
GUARD = 'put it under `if __name__ == "__main__":`'
KILL_KEY = "s0035"  # in block 3 with block_size=10


def _run_script(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], float]:
    script = tmp_path / "build_script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    return proc, time.monotonic() - t0


def _check_guard_failure(proc: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    assert proc.returncode != 0
    assert "done" not in proc.stdout
    assert GUARD in proc.stderr
    assert "BuildWorkerError: a build worker" in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) < 30, proc.stderr
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_script_without_main_guard_fails_fast_with_a_hint_list_source(tmp_path):
    proc, _ = _run_script(
        tmp_path,
        """
        import sys
        import numpy as np
        from build_shards import build_shards
        items = [{"x": np.zeros(4, np.float32) + i, "label": i} for i in range(200)]
        build_shards(items, sys.argv[1], workers=2, shard_max_count=20)
        print("done")
        """,
    )
    _check_guard_failure(proc, tmp_path)  # within the 60 s timeout (it hung for minutes)


def test_script_without_main_guard_fails_fast_with_a_hint_hf_dataset(tmp_path):
    pytest.importorskip("datasets")
    # an in-memory Dataset big enough that sending it to a worker fills the pipe that starts it
    proc, _ = _run_script(
        tmp_path,
        """
        import sys
        import datasets
        from build_shards import build_shards
        n = 5000
        ds = datasets.Dataset.from_dict(
            {"x": [[float(i)] * 8 for i in range(n)], "label": list(range(n))}
        )
        build_shards(ds, sys.argv[1], workers=2, shard_max_count=250)
        print("done")
        """,
    )
    _check_guard_failure(proc, tmp_path)  # within the 60 s timeout (it hung for minutes)


def test_the_guarded_script_builds(tmp_path):
    proc, _ = _run_script(
        tmp_path,
        """
        import sys
        import numpy as np
        from build_shards import build_shards
        if __name__ == "__main__":
            items = [{"x": np.zeros(4, np.float32) + i, "label": i} for i in range(200)]
            build_shards(items, sys.argv[1], workers=2, shard_max_count=20)
            print("done")
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert Manifest.load(tmp_path / "ds").num_samples == 200


def test_build_call_while_a_worker_reimports_main_exits_with_the_hint(monkeypatch):
    refuse_reimported_main()  # the main process: nothing happens
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(SystemExit, match="not started in a worker process; if your script"):
        refuse_reimported_main()


def die_on_marked_key(sample: dict) -> dict:
    """map for the killed-worker test: SIGKILL its own worker process on KILL_KEY while the
    marker file exists (never in the parent)."""
    marker = sample.pop("marker")
    if (
        sample["__key__"] == KILL_KEY
        and os.path.exists(marker)
        and multiprocessing.parent_process() is not None
    ):
        os.kill(os.getpid(), signal.SIGKILL)
    return sample


def test_killed_worker_raises_within_seconds_naming_the_block_and_keeps_finished_ones(tmp_path):
    marker = tmp_path / "kill-marker"
    marker.touch()
    items = [{"__key__": f"s{i:04d}", "x": i, "marker": str(marker)} for i in range(60)]
    out = tmp_path / "ds"
    options = dict(workers=2, block_size=10, shard_max_count=5, map=die_on_marked_key)
    t0 = time.monotonic()
    with pytest.raises(BuildWorkerError, match=r"killed by SIGKILL\).* while building block 3;"):
        build_shards(items, out, **options)
    assert time.monotonic() - t0 < 30
    assert not (out / "manifest.json").exists()
    records = sorted((out / "_build").glob("block-*.json"))
    assert records, "the blocks finished before the kill were removed"
    assert "block-00003.json" not in [r.name for r in records]
    kept = {}  # the shards of the finished blocks, with their modification times
    for path in records:
        for shard in json.loads(path.read_text())["splits"]["train"]:
            kept[shard["path"]] = (out / shard["path"]).stat().st_mtime_ns

    marker.unlink()
    manifest = build_shards(items, out, **options)  # a rerun resumes
    assert manifest.num_samples == 60
    assert {p: (out / p).stat().st_mtime_ns for p in kept} == kept  # not written again


@pytest.mark.usefixtures("infer_first_sample_only")  # the bad item comes after blocks
def test_an_error_in_a_worker_is_raised_as_it_is_with_progress_on(tmp_path):
    items = [{"__key__": f"s{i:04d}", "x": i} for i in range(400)]
    items[350]["x"] = "not an int"
    calls = []
    with pytest.raises(SchemaError, match="sample 's0350': field 'x': expected an int"):
        build_shards(
            items, tmp_path / "ds", workers=2, block_size=50, shard_max_count=25,
            progress=lambda done, total: calls.append(done),
        )  # fmt: skip
    assert calls and calls[-1] <= 400
    assert not (tmp_path / "ds" / "manifest.json").exists()
