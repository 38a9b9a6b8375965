"""``wdsloader.cli.benchmark`` (measure_loader, the ``wdsloader bench`` command) and the bench suite."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from wdsloader.cli import BenchResult, batch_size_of, main, measure_loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COUNTS = [50, 30, 20]


@pytest.fixture()
def tiny(tmp_path):
    root = str(tmp_path / "ds")
    manifest = write_dataset(root, {"train": COUNTS})
    return root, manifest


def test_measure_loader_reads_every_sample_once(tiny):
    root, manifest = tiny
    keys: list[str] = []

    def collate(samples):
        keys.extend(s["__key__"] for s in samples)
        return {"__key__": [s["__key__"] for s in samples]}

    result = measure_loader(root, batch_size=16, drop_last=False, collate_fn=collate)
    assert isinstance(result, BenchResult)
    assert result.samples == sum(COUNTS) == len(keys) == len(set(keys))
    assert result.batches == -(-sum(COUNTS) // 16)
    split = manifest.split("train")
    assert result.bytes == round(split.num_bytes / split.num_samples * result.samples)
    assert result.seconds > 0
    assert 0 < result.time_to_first_batch_s <= result.seconds
    assert result.samples_per_s == pytest.approx(result.samples / result.seconds)
    assert result.mb_per_s == pytest.approx(result.bytes / result.seconds / 1e6)
    assert result.peak_rss_mb is None or result.peak_rss_mb > 10
    assert set(result.to_dict()) >= {"samples", "samples_per_s", "time_to_first_batch_s"}


def test_measure_loader_max_batches_and_default_collate(tiny):
    root, _ = tiny
    result = measure_loader(root, "train", batch_size=8, max_batches=3)
    assert (result.batches, result.samples) == (3, 24)
    with pytest.raises(ValueError, match="max_batches"):
        measure_loader(root, batch_size=8, max_batches=0)


def test_batch_size_of():
    import torch

    assert batch_size_of({"__key__": ["a", "b"]}) == 2
    assert batch_size_of({"x": torch.zeros(5, 3)}) == 5
    assert batch_size_of((torch.zeros(4), ["a"] * 4)) == 4
    with pytest.raises(TypeError):
        batch_size_of(3)


def test_bench_command_prints_the_three_numbers(tiny, capsys):
    root, _ = tiny
    argv = ["bench", str(root), "--split", "train", "--num-workers", "0", "--batch-size", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "samples/s:" in out and "MB/s:" in out and "time to first batch:" in out
    assert "96 samples in 12 batches" in out  # drop_last for train: 100 -> 12 full batches


def test_bench_of_a_remote_dataset_prints_what_it_chose_and_the_share_of_the_ceiling(
    http_server, capsys
):
    manifest = write_dataset(str(http_server.root / "ds"), {"train": COUNTS})
    shards = manifest.split("train").shards
    url = f"{http_server.url}/ds"
    argv = ["bench", url, "--split", "train", "--num-workers", "0", "--batch-size", "8"]
    http_server.clear_log()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"measured path: +round trip \d+\.\d ms, - a connection", out
    )  # no request large enough for a rate
    assert re.search(r"chosen: +requests of \d+ MiB, \d+ in flight, \d+ MiB read ahead", out)
    assert re.search(
        r"ceiling: +[\d,.]+ MB/s \(parallel 16 MiB ranged GETs .*\): \d+% reached", out
    )
    # the ceiling: every shard read once more, whole, as ranged GETs (after the epoch's reads)
    tars = [(r.path, r.start, r.stop) for r in http_server.requests() if r.path.endswith(".tar")]
    whole = [(f"/ds/{s.path}", 0, s.num_bytes) for s in shards]
    assert tars[-len(whole) :] == whole or sorted(tars[-len(whole) :]) == sorted(whole)


def test_bench_command_passes_storage_options(tiny, capsys, monkeypatch):
    import wdsloader.cli.benchmark as bm

    seen = {}

    def fake(dataset, split, **kw):
        seen.update(kw)
        return BenchResult(
            samples=1, batches=1, bytes=1, seconds=1.0, samples_per_s=1.0, mb_per_s=0.0,
            time_to_first_batch_s=0.5, peak_rss_mb=None,
        )  # fmt: skip

    monkeypatch.setattr(bm, "measure_loader", fake)
    argv = ["bench", "s3://b/x", "--split", "val", "--num-workers", "2", "--batch-size", "4"]
    argv += ["--max-batches", "5", "--storage-option", "anon=true"]
    argv += ["--storage-option", "client_kwargs.endpoint_url=http://127.0.0.1:9"]
    assert main(argv) == 0
    assert seen["storage_options"] == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
    }
    assert (seen["num_workers"], seen["batch_size"], seen["max_batches"]) == (2, 4, 5)
    assert "0.500 s" in capsys.readouterr().out


@pytest.mark.slow
def test_suite_quick_mode(tmp_path):
    """bench/run.py --quick end to end with the peers this environment has (webdataset)."""
    only = ["ours", "raw"]
    if importlib.util.find_spec("webdataset") is not None:
        only += ["webdataset", "ours_adopted"]
    out, data = tmp_path / "out", tmp_path / "data"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "bench", "run.py"),
        "--quick",
        "--max-samples",
        "1024",
        "--only",
        ",".join(only),
        "--workloads",
        "embed",
        "--parts",
        "read,memory,s3",
        "--workers",
        "0",
        "--out",
        str(out),
        "--data",
        str(data),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    agg = doc["summary"]["measurements"]
    ours = agg["read embed ours W0"]
    assert ours["runs"] == 1 and ours["exactly_once"] is True
    assert ours["samples_per_s"] > 0 and ours["ttfb_s"] > 0
    assert ours["parsed_samples"] == 0  # every batch on the whole-batch path
    assert 0.2 < ours["dist_over_n"] < 0.5
    limit = agg["read embed raw_read W0"]["samples_per_s"]
    assert limit > 0 and agg["read embed raw_batches W0"]["samples_per_s"] > 0
    if "webdataset" in only:
        assert agg["read embed webdataset W0"]["exactly_once"] is True
        adopted = agg["read embed ours_adopted W0"]
        assert adopted["exactly_once"] is True and adopted["samples"] == ours["samples"]
    for peer in ("mosaic", "litdata", "hf"):
        assert peer not in doc["systems"]
    assert agg["memory embed-small ours W0"]["peak_rss_mb"] > 0
    targets = {t["target"]: t for t in doc["summary"]["targets"]}
    assert any(t["status"] in ("PASS", "MISS") for t in targets.values())
    md = (out / "results.md").read_text()
    assert "## Targets" in md and "wdsloader" in md
    share = f"| {100 * ours['samples_per_s'] / limit:.1f}% |"  # the share of the raw limit
    assert share in md


def test_busy_targets_are_the_busy_runs_of_ours_only():
    """The targets table has a busy row per busy kind, workload and num_workers ours ran; the
    other runs (plain reads, memory, builds) give none (they gave "busy consumer ()" rows)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from bench import busy

    rate = {"samples_per_s": 100.0}
    agg = {
        "read embed ours W0": rate,
        "read embed webdataset W0": rate,
        "memory embed ours W2": rate,
        "build embed ours W0": rate,
        busy.label("matmul", "embed_running", "ours", 2): {"samples_per_s": 300.0},
        busy.label("matmul", "embed_running", "mosaic", 2): {"samples_per_s": 100.0},
        busy.label("matmul", "embed_running", "webdataset", 2): {"samples_per_s": 150.0},
        busy.label("gil", "embed_running", "ours", 0): {"samples_per_s": 50.0},
    }
    assert busy.targets(agg) == [
        ("busy consumer (gil), embed_running, num_workers=0: ours >= 1.5x the best peer", None,
         1.5),
        ("busy consumer (matmul), embed_running, num_workers=2: ours >= 1.5x the best peer",
         2.0, 1.5),
    ]  # fmt: skip


def test_busy_consumer_read_and_report(tmp_path):
    """A busy read (bench/busy.py): the consumer's work runs after every batch, the read still
    sees every sample once, and the report has the busy table with the wait share and the
    ratio to a peer's run."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from bench import busy, report, systems, worker

    n, path = 512, str(tmp_path / "ours")
    systems.WRITE["ours"]("embed_running", n, path, 1, 4 * 2**20)
    spec = {"task": "read", "system": "ours", "workload": "embed_running", "n": n,
            "path": path, "workers": 0, "max_seconds": None, "busy": "gil"}  # fmt: skip
    result = worker.do_read(spec)
    assert result["exactly_once"] is True and result["busy"] == "gil"
    assert result["work_ms"] > 0 and result["step_work_ms"] > 0
    assert 0 <= result["wait_share"] <= 1
    peer = {**result, "samples_per_s": result["samples_per_s"] / 2}
    agg = {
        busy.label("gil", "embed_running", "ours", 0): report.aggregate([result]),
        busy.label("gil", "embed_running", "litdata", 0): report.aggregate([peer]),
    }
    ((name, ratio, need),) = busy.targets(agg)
    assert "num_workers=0" in name and ratio == pytest.approx(2.0) and need == 1.5
    md = "\n".join(busy.markdown(agg, systems.TITLES, busy.WORK_TITLES))
    share = f"{100 * result['wait_share']:.0f}%"
    assert "## Busy consumer (gil" in md and "| LitData | 0 |" in md and "| 2.0x |" in md
    assert f"| wdsloader | 0 | {result['samples_per_s']:,.0f} | – | {share} |" in md
    with pytest.raises(ValueError, match="unknown busy kind 'spin'"):
        busy.Consumer("spin")


def test_the_bench_runner_writes_the_bytecode_of_our_packages(tmp_path, monkeypatch):
    """Fresh bench workers must not compile our modules inside their timed windows where the
    machine sets PYTHONDONTWRITEBYTECODE (the peers' installed modules come compiled)."""
    root = tmp_path / "tree"
    (root / "wdsloader" / "sub").mkdir(parents=True)
    (root / "wdsloader" / "sub" / "mod.py").write_text("X = 1\n")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from bench import run as bench_run

    monkeypatch.setattr(bench_run, "ROOT", str(root))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    bench_run.Runner(sys.executable, str(tmp_path / "raw"))
    pyc = importlib.util.cache_from_source(str(root / "wdsloader" / "sub" / "mod.py"))
    assert os.path.exists(pyc)
