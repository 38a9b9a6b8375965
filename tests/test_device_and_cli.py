"""Device prefetch (CPU always, CUDA where available) and the `wdsloader` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.cli import main
from wdsloader.cli.commands import show_value
from wdsloader.stream import DevicePrefetcher


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("dev") / "ds"
    write_dataset(str(root), {"train": [20, 13], "val": [5]})
    return str(root)


def test_prefetcher_on_cpu_yields_the_loader_batches(ds):
    loader = create_loader(ds, "train", batch_size=8, drop_last=False)
    plain = [b["vec"] for b in create_loader(ds, "train", batch_size=8, drop_last=False)]
    moved = [b["vec"] for b in DevicePrefetcher(loader, "cpu")]
    assert len(moved) == len(plain) == len(loader) == 5
    assert all(torch.equal(a, b) for a, b in zip(plain, moved, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefetcher_on_cuda_pins_and_overlaps(ds):
    loader = create_loader(ds, "train", batch_size=8, drop_last=False, num_workers=2)
    first = next(iter(loader))
    assert first["vec"].is_pinned()  # pin_memory takes effect with CUDA
    batches = list(DevicePrefetcher(loader, "cuda"))
    assert all(b["vec"].device.type == "cuda" for b in batches)
    reference = [b["vec"] for b in create_loader(ds, "train", batch_size=8, drop_last=False)]
    assert all(torch.equal(b["vec"].cpu(), r) for b, r in zip(batches, reference, strict=True))


def test_pin_memory_is_off_without_cuda(ds):
    loader = create_loader(ds, "train", batch_size=4, pin_memory=True)
    assert loader.pin_memory == torch.cuda.is_available()


def test_cli_info_and_head(ds, capsys):
    assert main(["info", ds]) == 0
    out = capsys.readouterr().out
    assert "38 samples" in out and "train" in out and "vec" in out and "D=4" in out
    assert main(["head", ds, "--split", "val", "-n", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == {
        "__key__": "val0000000",
        "__index__": 0,
        "vec": "tensor(shape=[4], dtype=float32, [0.0, 1.0, 2.0, 3.0])",
        "idx": 0,
        "meta": {"i": 0, "shard": 0},
    }


def test_cli_head_shows_values_with_arrays_abbreviated():
    assert show_value(torch.arange(64, dtype=torch.float32) * 0.25 - 0.5) == (
        "tensor(shape=[64], dtype=float32, [-0.5, -0.25, 0.0, 0.25, ...])"
    )
    assert show_value(np.full((2, 3), 7, dtype=np.int16)) == (
        "array(shape=[2, 3], dtype=int16, [7, 7, 7, 7, ...])"
    )
    assert show_value(torch.tensor([True, False])) == "tensor(shape=[2], dtype=bool, [True, False])"
    assert show_value(torch.tensor(3, dtype=torch.int64)) == 3
    assert show_value(np.float32(0.5)) == 0.5
    assert show_value(torch.tensor([1e-7, float("nan")])).endswith("[1e-07, nan])")
    assert show_value("short text") == "short text"
    assert show_value("x" * 1000) == "x" * 200 + "... (1000 characters)"
    assert show_value(b"\x00" * 10) == "bytes(len=10)"
    assert show_value({"a": [1, 2]}) == {"a": [1, 2]}


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "--num-workers", "0", "--batch-size", "2", "--max-batches", "12"],
        ["validate", "--deep"],
    ],
)
def test_cli_progress_bars_stay_out_of_logs(ds, command):
    """stderr to a pipe (a job's log): no tqdm frames; the report still goes to stdout."""
    name, *flags = command
    proc = subprocess.run(
        [sys.executable, "-m", "wdsloader.cli", name, ds, *flags],
        capture_output=True,  # bytes: text mode would turn the frames' b"\r" into newlines
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"\r" not in proc.stderr and b"/s]" not in proc.stderr, proc.stderr
    assert (b"samples/s:" if name == "bench" else b"OK: 3 shards, 38 samples") in proc.stdout


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wdsloader: error: ") and "manifest not found" in err


class _Terminal:
    """A stand-in for stderr that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text.append(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("tty", "enabled", "shown"), [(True, True, True), (False, True, False),
                                                       (True, False, False)])  # fmt: skip
def test_progress_bar_draws_only_on_a_terminal_when_asked(monkeypatch, tty, enabled, shown):
    from wdsloader.progress import progress_bar

    err = _Terminal(tty)
    monkeypatch.setattr(sys, "stderr", err)
    with progress_bar(total=3, unit="shard", enabled=enabled) as bar:
        assert (not bar.disable) == shown
        bar.update(3)
    assert any("3/3" in t for t in err.text) == shown
