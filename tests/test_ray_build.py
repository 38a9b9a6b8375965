"""Building on Ray (the session's local cluster of 2 CPUs, conftest's ``local_ray``): the same bytes as the
local engine, to a folder and to S3; failed tasks retried without a shard lost or duplicated; an
interrupted build resumed; outputs and options Ray cannot take refused (lists and generators:
tests/test_ray_sources.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data

from build_shards import BuildError, build_shards
from build_shards.cli import main as cli_main
from wdsloader.errors import SchemaError

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
OPTS = dict(
    splits={"train": 0.7, "val": 0.3},
    group_by="group",
    shard_max_count=16,
    shard_max_bytes=40_000,
    block_size=50,
    seed=3,
)
N = 400  # 8 blocks


pytestmark = [pytest.mark.usefixtures("infer_first_sample_only"), pytest.mark.slow]  # a Ray cluster


@pytest.fixture(autouse=True)
def ray_cluster(request, local_ray):
    """The session's Ray (``local_ray``), shared by the tests. A test marked ``stops_a_build`` (a
    build stopped by a data error or on the driver stops its tasks through the abort flag,
    waiting up to a minute) keeps it only once every CPU of it is free again, so that no task of
    that test can still run in the next; else it is shut down (the next test starts a new one)."""
    yield
    if request.node.get_closest_marker("stops_a_build") and not _all_cpus_free(timeout=60.0):
        ray.shutdown()


def _all_cpus_free(timeout: float) -> bool:
    """Whether every CPU of the cluster is free (no task runs) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polls a condition (the tasks' release of their CPUs)
    return True


def sample(i: int) -> dict:
    """A realistic sample: an array, an int label, JSON metadata and text."""
    rng = np.random.default_rng(i)
    return {
        "__key__": f"s{i:05d}",
        "emb": rng.standard_normal(32).astype(np.float32),
        "cls": i % 7,
        "meta": {"source": "web", "len": int(rng.integers(0, 100))},
        "text": "word " * (i % 23),
        "group": f"g{i // 4}",
    }


class Items(torch.utils.data.Dataset):
    """A torch map-style dataset; with ``marker`` set, reading ``at`` fails once: ``how`` is
    ``"raise"`` (an OSError) or ``"exit"`` (the worker process dies), the marker file recording
    that it happened."""

    def __init__(self, n: int, marker: str | None = None, at: int = -1, how: str = "raise"):
        self.n, self.marker, self.at, self.how = n, marker, at, how

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i == self.at and self.marker and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            if self.how == "exit":
                os._exit(3)
            raise OSError(f"flaky read of item {i}")
        return sample(i)


class Interrupt(Exception):
    """Stands for Ctrl-C on the driver."""


class StopAfter:
    """A progress callback that stops the driver once ``n`` items are done."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, done: int, total: int) -> None:
        if done >= self.n:
            raise Interrupt(f"stopped at {done} of {total}")


def digests(fs, root: str) -> dict[str, str]:
    """sha256 of every file of a dataset (the manifest's creation time set to a constant)."""
    out = {}
    for path in sorted(fs.find(root)):
        data = fs.cat_file(path)
        rel = path[len(root.rstrip("/")) + 1 :]
        if rel == "manifest.json":
            body = json.loads(data)
            body["build"]["created"] = "CREATED"
            data = json.dumps(body, sort_keys=True).encode()
        out[rel] = hashlib.sha256(data).hexdigest()[:16]
    return out


def local_digests(path: Path) -> dict[str, str]:
    import fsspec

    return digests(fsspec.filesystem("file"), str(path))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, str]:
    """The local engine's output for ``Items(N)`` with ``OPTS``."""
    out = tmp_path_factory.mktemp("ref") / "ds"
    build_shards(Items(N), out, **OPTS)
    return local_digests(out)


def test_ray_writes_the_local_engines_bytes_to_a_folder(tmp_path, reference):
    seen: list[int] = []
    m = build_shards(
        Items(N), tmp_path / "ds", engine="ray", progress=lambda d, t: seen.append(d), **OPTS
    )
    assert m.build["num_blocks"] == 8 and m.num_samples == N
    assert seen == list(range(50, N + 1, 50))  # the driver's progress: one step per block
    got = local_digests(tmp_path / "ds")
    assert got == reference
    assert sum(p.endswith(".tar") for p in got) >= 16  # several shards per block and split


def test_ray_writes_the_local_engines_bytes_to_s3(s3_bucket, reference):
    import s3fs

    url, options = s3_bucket
    build_shards(Items(N), f"{url}/ds", engine="ray", storage_options=options, **OPTS)
    fs = s3fs.S3FileSystem(**options)
    assert digests(fs, f"{url[len('s3://') :]}/ds") == reference


def test_a_task_that_raises_once_is_retried_and_nothing_is_lost(tmp_path, reference):
    marker = tmp_path / "failed-once"
    build_shards(Items(N, str(marker), at=123), tmp_path / "ds", engine="ray", **OPTS)
    assert marker.exists()  # the read of item 123 did fail, once
    assert local_digests(tmp_path / "ds") == reference


def test_a_killed_worker_is_retried_and_nothing_is_lost_or_duplicated(tmp_path, reference):
    marker = tmp_path / "killed-once"
    items = Items(N, str(marker), at=260, how="exit")
    build_shards(items, tmp_path / "ds", engine="ray", **OPTS)
    assert marker.exists()
    got = local_digests(tmp_path / "ds")
    assert got == reference  # no stray half-written shard of the killed attempt either
    assert not list((tmp_path / "ds").rglob("*.tmp-*"))


@pytest.mark.stops_a_build
def test_an_interrupted_driver_resumes_on_rerun_keeping_finished_blocks(tmp_path, reference):
    out = tmp_path / "ds"
    with pytest.raises(Interrupt):
        build_shards(Items(N), out, engine="ray", progress=StopAfter(100), **OPTS)
    assert not (out / "manifest.json").exists()
    kept = sorted((out / "_build").glob("block-*.json"))
    assert 2 <= len(kept) < 8  # the finished blocks' records, not all
    blocks = [int(p.stem.split("-")[1]) for p in kept]
    shards = [p for b in blocks for p in out.glob(f"*/*-{b:05d}-*.tar")]
    before = {p: p.stat().st_mtime_ns for p in shards}
    assert not list(out.rglob("*.tmp-*"))  # cancelled tasks cleaned up after themselves

    seen: list[int] = []
    m = build_shards(Items(N), out, engine="ray", progress=lambda d, t: seen.append(d), **OPTS)
    assert m.num_samples == N
    assert local_digests(out) == reference
    assert {p: p.stat().st_mtime_ns for p in shards} == before  # kept blocks not rewritten
    assert seen[-1] == N


@pytest.mark.stops_a_build
def test_a_ray_build_stopped_on_the_driver_is_resumed_by_the_local_engine(tmp_path, reference):
    out = tmp_path / "ds"
    with pytest.raises(Interrupt):
        build_shards(Items(N), out, engine="ray", progress=StopAfter(100), **OPTS)
    blocks = [int(p.stem.split("-")[1]) for p in (out / "_build").glob("block-*.json")]
    shards = [p for b in blocks for p in out.glob(f"*/*-{b:05d}-*.tar")]
    before = {p: p.stat().st_mtime_ns for p in shards}
    assert len(blocks) >= 2 and shards
    build_shards(Items(N), out, **OPTS)  # the local engine: the same fingerprint, so it resumes
    assert {p: p.stat().st_mtime_ns for p in shards} == before
    assert local_digests(out) == reference


@pytest.mark.stops_a_build
def test_a_data_error_in_a_task_is_raised_as_itself_and_leaves_nothing(tmp_path):
    class_ = BadShape(N)
    with pytest.raises(SchemaError, match=r"s00210.*emb|emb.*s00210"):
        build_shards(class_, tmp_path / "ds", engine="ray", **OPTS)
    assert not list((tmp_path / "ds").rglob("*.tar"))
    assert not (tmp_path / "ds" / "_build").exists()


class BadShape(Items):
    """Item 210's array has another shape than the rest."""

    def __getitem__(self, i: int) -> dict:
        s = sample(i)
        if i == 210:
            s["emb"] = np.zeros(5, np.float32)
        return s


def _write_files(folder: Path) -> list[Path]:
    """Three JSONL files whose items straddle the blocks (blank lines in between)."""
    folder.mkdir()
    paths = []
    for f in range(3):
        p = folder / f"part-{f}.jsonl"
        lines = []
        for i in range(f * 100, f * 100 + 70 + f * 11):
            lines.append(json.dumps({"__key__": f"j{i:05d}", "label": i % 5, "text": "t" * i}))
            if i % 9 == 0:
                lines.append("")
        p.write_text("\n".join(lines) + "\n")
        paths.append(p)
    return paths


def test_jsonl_files_are_scanned_and_read_by_range_to_the_same_bytes(tmp_path):
    files = [str(p) for p in _write_files(tmp_path / "in")]
    opts = dict(splits={"train": 0.8, "val": 0.2}, shard_max_count=10, block_size=25)
    ref = build_shards(files, tmp_path / "ref", **opts)
    got = build_shards(files, tmp_path / "ray", engine="ray", **opts)
    assert got.num_samples == ref.num_samples == 3 * 70 + 11 + 22
    assert local_digests(tmp_path / "ray") == local_digests(tmp_path / "ref")


@pytest.mark.stops_a_build
def test_a_bad_input_file_found_by_the_scan_task_is_named_with_its_line(tmp_path):
    good, bad = tmp_path / "a.txt", tmp_path / "b.txt"
    good.write_text("one\n\ntwo\n")
    bad.write_bytes(b"three\n\xff\xfe\n")
    with pytest.raises(BuildError, match=r"b\.txt:2: not UTF-8"):
        build_shards([str(good), str(bad)], tmp_path / "ds", engine="ray")
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_the_cli_builds_on_ray_with_the_same_bytes(tmp_path, capsys):
    _write_files(tmp_path / "in")
    glob = str(tmp_path / "in" / "*.jsonl")
    common = ["--splits", "train=0.5,val=0.5", "--shard-max-count", "10", "--no-progress"]
    assert cli_main(["build", glob, "-o", str(tmp_path / "ref"), *common]) == 0
    assert cli_main(["build", glob, "-o", str(tmp_path / "ray"), "--engine", "ray", *common]) == 0
    assert local_digests(tmp_path / "ray") == local_digests(tmp_path / "ref")
    with pytest.raises(SystemExit):
        cli_main(["build", glob, "-o", str(tmp_path / "x"), "--ray-address", "auto", *common])
    assert "--ray-address needs --engine ray" in capsys.readouterr().err


def test_outputs_and_options_ray_cannot_take_are_refused(tmp_path):
    with pytest.raises(BuildError, match="memory:// lives in one process: engine='ray'"):
        build_shards(Items(10), "memory://ray-out", engine="ray")
    with pytest.raises(ValueError, match="workers is an option of the local engine"):
        build_shards(Items(10), tmp_path / "ds", engine="ray", workers=2)
    with pytest.raises(ValueError, match="engine must be one of 'local', 'ray'"):
        build_shards(Items(10), tmp_path / "ds", engine="spark")
    assert not (tmp_path / "ds").exists()


def test_import_build_shards_never_imports_ray():
    code = "import sys, build_shards, build_shards.engines; print('ray' in sys.modules)"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_datasets_datasetdict_keeps_its_splits_and_the_local_bytes(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [sample(i) for i in range(120)]
    cols = {k: [r[k] for r in rows] for k in ("__key__", "emb", "cls", "text")}
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({k: v[:90] for k, v in cols.items()}),
        val=datasets.Dataset.from_dict({k: v[90:] for k, v in cols.items()}),
    )
    opts = dict(shard_max_count=16, block_size=40)
    build_shards(dd, tmp_path / "ref", **opts)
    m = build_shards(dd, tmp_path / "ray", engine="ray", **opts)
    assert (m.splits["train"].num_samples, m.splits["val"].num_samples) == (90, 30)
    assert local_digests(tmp_path / "ray") == local_digests(tmp_path / "ref")
