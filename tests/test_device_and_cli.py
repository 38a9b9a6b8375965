"""Device prefetch (CPU always, CUDA where available) and the `wdsloader` command line."""

from __future__ import annotations

import json

import pytest
import torch

from tests.dataset_factory import write_dataset
from wdsloader import DevicePrefetcher, create_loader
from wdsloader.cli import main


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
    assert first["__key__"] == "val0000000" and first["idx"].startswith("tensor[]")


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wdsloader: error: ") and "manifest not found" in err
