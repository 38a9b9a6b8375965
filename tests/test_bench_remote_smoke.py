"""A smoke of the remote benchmark (bench/remote/run.py): a few hundred samples, ours only,
through the latency proxy in front of the suite's moto server, so that the mode cannot rot.
It checks that every reported field is filled and that the bytes fetched are the dataset's
(not timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from bench.remote import report
from bench.remote import run as remote
from bench.remote.machine import machine_busy, process_tree_cpu

N = 512  # two batches of 256: the train split drops no partial batch


@pytest.mark.slow  # a build and a read in processes of their own (~1 min on 2 loaded cores)
def test_remote_bench_reports_every_field(s3_server, tmp_path):
    out = tmp_path / "out"
    bucket = f"rbench-{uuid.uuid4().hex[:12]}"
    argv = ["--n", str(N), "--shard-mib", "1", "--profiles", "2ms", "--workers", "0"]
    argv += ["--only", "ours", "--endpoint", s3_server, "--bucket", bucket, "--timeout", "300"]
    argv += ["--out", str(out), "--data", str(tmp_path / "data"), "--name", "smoke"]
    assert remote.main(argv) == 0

    doc = json.loads((out / "smoke.json").read_text())
    (row,) = doc["summary"]["2ms"]
    assert row["system"] == "ours" and row["workers"] == 0 and row["error"] is None
    assert row["exactly_once"] is True
    for field in ("samples_per_s", "mb_per_s", "ttfb_s", "cpu_seconds", "samples_per_cpu_s"):
        assert row[field] > 0, field
    assert 0 < row["share_of_ceiling"]
    assert 0 < row["machine_busy_share"] <= 1
    # moto runs in this process: no server process to count, so no server + proxy sum
    assert row["server_proxy_cpu_s"] is None
    # every shard byte once, plus the manifest, the idx files and HTTP headers
    assert 0.95 <= row["fetched_over_dataset"] <= 1.5
    assert row["requests"]["GET-range"] + row["requests"]["GET"] >= 1
    assert doc["profiles"]["2ms"]["ceiling"]["bytes"] == sum(
        size for path, size in _tars(doc, bucket)
    )
    assert "dataset_bytes" in doc and doc["dataset_bytes"]["ours"] > 0
    run = doc["profiles"]["2ms"]["runs"]["ours W0"]
    assert run["machine_cpu"]["proxy_cpu_s"] > 0 and run["machine_cpu"]["server_cpu_s"] is None
    log = json.loads((out / "raw-smoke" / run["proxy"]["log_file"]).read_text())
    kinds = [entry[2] for entry in log]
    assert len(log) == sum(run["proxy"]["requests"].values())
    assert kinds.count("GET-range") == row["requests"]["GET-range"]
    md = (out / "smoke.md").read_text()
    assert "| wdsloader | 0 |" in md and "2 ms RTT" in md
    assert "testing" not in (out / "smoke.json").read_text()  # the server's keys stay out


def _tars(doc, bucket):
    run = doc["profiles"]["2ms"]["runs"]["ours W0"]
    assert run["spec"]["path"] == f"s3://{bucket}/ours"
    return doc["tar_objects"]


def test_update_block_replaces_between_markers(tmp_path):
    page = tmp_path / "speed.md"
    page.write_text("intro\n<!-- remote-bench:start -->\nold\n<!-- remote-bench:end -->\nrest\n")
    assert report.update_block(str(page), "| new |\n")
    assert page.read_text() == (
        "intro\n<!-- remote-bench:start -->\n| new |\n<!-- remote-bench:end -->\nrest\n"
    )
    other = tmp_path / "none.md"
    other.write_text("no markers\n")
    assert not report.update_block(str(other), "x") and other.read_text() == "no markers\n"


def test_rows_derive_share_fetched_and_requests():
    doc = {
        "dataset_bytes": {"ours": 100_000_000, "litdata": 50_000_000},
        "profiles": {
            "40ms": {
                "rtt_s": 0.04,
                "rate_bytes_per_s": 125e6,
                "ceiling": {"mb_per_s": 200.0},
                "runs": {
                    "ours_cache W2": {
                        "seconds": 2.0,
                        "samples_per_s": 10.0,
                        "exactly_once": True,
                        "proxy": {
                            "bytes_down": 210_000_000,
                            "requests": {"GET-range": 7, "HEAD": 2, "PUT": 1},
                        },
                    },
                    "litdata W0": {"error": "RuntimeError: stalled\ntraceback", "proxy": {}},
                },
            }
        },
    }
    ours, lit = report.rows(doc, "40ms")
    assert (ours["system"], ours["workers"], ours["error"]) == ("ours_cache", 2, None)
    assert ours["share_of_ceiling"] == 0.25  # 100 MB in 2 s = 50 MB/s of 200
    assert ours["fetched_over_dataset"] == 2.1
    assert ours["requests"] == {"GET-range": 7, "GET": 0, "HEAD": 2, "LIST": 0}
    assert ours["other_requests"] == 1
    assert lit["error"] == "RuntimeError: stalled" and lit["fetched_over_dataset"] == 0
    assert "| LitData | 0 | failed: RuntimeError: stalled |" in report.table(doc, "40ms")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads Linux's /proc")
def test_a_server_process_trees_cpu_counts_its_children():
    """The server's CPU-seconds include the processes it started (a server may fork)."""
    burn = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\n"
    burn += "sys.stdin.read()"
    parent = (
        "import subprocess, sys\n"
        f"c = subprocess.Popen([sys.executable, '-c', {burn!r}], stdout=subprocess.PIPE,"
        " stdin=subprocess.PIPE, text=True)\n"
        "print(c.stdout.readline(), end='', flush=True)\ninput()\nc.stdin.close(); c.wait()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "done\n"
        assert process_tree_cpu(proc.pid) >= 0.3  # the child's burn, not the idle parent's
    finally:
        proc.communicate("\n", timeout=60)
    busy = machine_busy()
    assert busy is not None and 0 < busy[0] <= busy[1]
