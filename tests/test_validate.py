"""Batch and dataset validation (wdsloader.validate) and `wdsloader validate` / `bench --help`."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import uuid

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from build_shards import build_shards
from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.cli import main
from wdsloader.errors import ManifestError
from wdsloader.format import FieldSpec, Manifest
from wdsloader.format.index import iter_samples
from wdsloader.io.storage import url_to_fs
from wdsloader.stream import ShardStreamDataset
from wdsloader.validate import (
    BatchValidationError,
    ValidationReport,
    validate_batch,
    validate_dataset,
    validate_first_batch,
)

SCHEMA = {
    "emb": FieldSpec(ext="emb.npy", encoding="npy", dtype="float32", shape=["D"]),
    "negs": FieldSpec(ext="negs.npy", encoding="npy", dtype="float32", shape=["N_neg", "D"]),
    "label": FieldSpec(ext="label.cls", encoding="cls", dtype="int64", shape=[], range=[0, 4]),
    "score": FieldSpec(ext="score.json", encoding="json", dtype="json", range=[0, 1]),
    "text": FieldSpec(ext="text.txt", encoding="txt", dtype="str"),
}
DIMS = {"D": 8, "N_neg": 3}


def make_batch(b: int = 4, d: int = 8, n: int = 3) -> dict:
    return {
        "__key__": [f"k{i}" for i in range(b)],
        "emb": torch.zeros(b, d),
        "negs": torch.ones(b, n, d),
        "label": torch.arange(b) % 5,
        "score": [0.5] * b,
        "text": ["x"] * b,
    }


# -- validate_batch ------------------------------------------------------------------------------
def test_good_batch_passes():
    assert validate_batch(make_batch(), SCHEMA) is True
    assert validate_batch(make_batch(), SCHEMA, dims=DIMS) is True
    batch = make_batch()
    batch["score"] = torch.full((4,), 0.5)  # JSON floats collate into a float32 tensor
    batch["__index__"] = [0, 1, 2, 3]  # metadata is not a field
    assert validate_batch(batch, SCHEMA, dims=DIMS)


def test_error_is_an_assertion_error_and_pickles():
    batch = make_batch()
    batch["emb"][1, 0] = float("nan")
    with pytest.raises(AssertionError) as info:
        validate_batch(batch, SCHEMA)
    err = info.value
    assert isinstance(err, BatchValidationError)
    assert (err.field, err.rule, err.keys) == ("emb", "finite", ["k1"])
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.field, again.rule, again.keys) == (str(err), "emb", "finite", ["k1"])


def test_missing_and_unexpected_fields_are_listed():
    batch = make_batch()
    del batch["text"], batch["score"]
    batch["extra"] = torch.zeros(4)
    with pytest.raises(
        BatchValidationError,
        match=r"rule 'keys': missing fields \['score', 'text'\], unexpected fields \['extra'\]"
        r".*'k0', 'k1', 'k2', 'k3'",
    ) as info:
        validate_batch(batch, SCHEMA)
    assert info.value.rule == "keys" and info.value.field is None
    assert validate_batch(batch, SCHEMA, exact_keys=False)  # checks only the fields present


def test_dtype_mismatch_names_field_dtypes_and_keys():
    batch = make_batch()
    batch["emb"] = batch["emb"].double()
    with pytest.raises(
        BatchValidationError,
        match=r"field 'emb' failed rule 'dtype': dtype torch.float64, schema says float32"
        r".*'k0', 'k1', 'k2', 'k3'",
    ):
        validate_batch(batch, SCHEMA)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("text", torch.zeros(4), r"field 'text' failed rule 'dtype': expected a list"),
        ("label", [0, 1, 2, 3], r"field 'label' failed rule 'dtype': expected a tensor of int64"),
        ("score", "0.5", r"field 'score' failed rule 'dtype': expected a tensor or a list"),
    ],
)
def test_container_type_is_checked(name, value, message):
    batch = make_batch()
    batch[name] = value
    with pytest.raises(BatchValidationError, match=message):
        validate_batch(batch, SCHEMA)


def test_symbolic_dim_against_manifest_dims():
    batch = make_batch(d=5)
    assert validate_batch(batch, SCHEMA)  # consistent on its own
    with pytest.raises(
        BatchValidationError,
        match=r"field 'emb' failed rule 'shape': D=5 \(per-sample shape \[5\]\), but the manifest "
        r"dims has D=8 \(batch shape \[4, 5\]\)",
    ):
        validate_batch(batch, SCHEMA, dims=DIMS)


def test_symbolic_dim_disagreement_between_fields_names_both():
    batch = make_batch()
    batch["negs"] = torch.ones(4, 3, 6)
    with pytest.raises(
        BatchValidationError,
        match=r"field 'negs' failed rule 'shape': D=6 .*but field 'emb' has D=8",
    ) as info:
        validate_batch(batch, SCHEMA)
    assert info.value.keys == ["k0", "k1", "k2", "k3"]


def test_fixed_dims_and_rank_are_checked():
    schema = {"x": FieldSpec(ext="x.npy", encoding="npy", dtype="float32", shape=[2, 3])}
    ok = {"x": torch.zeros(5, 2, 3)}
    assert validate_batch(ok, schema)
    with pytest.raises(
        BatchValidationError, match=r"per-sample shape \[2, 4\], schema says \[2, 3\]"
    ):
        validate_batch({"x": torch.zeros(5, 2, 4)}, schema)
    with pytest.raises(BatchValidationError, match=r"per-sample shape \[6\], schema says \[2, 3\]"):
        validate_batch({"x": torch.zeros(5, 6)}, schema)
    with pytest.raises(BatchValidationError, match=r"rule 'shape'.*no batch dimension"):
        validate_batch({"x": torch.tensor(1.0)}, schema)


def test_batch_size_is_bound_across_tensors_and_lists():
    batch = make_batch()
    batch["label"] = torch.arange(3)
    with pytest.raises(
        BatchValidationError,
        match=r"field 'label' failed rule 'batch size': 3 rows, but field 'emb' has 4 rows",
    ):
        validate_batch(batch, SCHEMA)
    batch = make_batch()
    batch["text"] = ["x"] * 5
    with pytest.raises(BatchValidationError, match=r"field 'text'.*'batch size': 5 rows"):
        validate_batch(batch, SCHEMA)
    batch = make_batch()
    batch["__key__"] = ["a", "b"]
    with pytest.raises(BatchValidationError, match=r"field '__key__'.*2 keys, but field 'emb'"):
        validate_batch(batch, SCHEMA)


def test_nan_names_only_its_rows_keys_and_the_value():
    batch = make_batch()
    batch["emb"][2, 5] = float("nan")
    with pytest.raises(
        BatchValidationError,
        match=r"field 'emb' failed rule 'finite': 1 sample\(s\) hold NaN/Inf, first offending "
        r"value nan; sample\(s\): 'k2'$",
    ) as info:
        validate_batch(batch, SCHEMA)
    assert info.value.keys == ["k2"]
    batch = make_batch()
    batch["negs"][1, 0, 0] = float("-inf")
    batch["negs"][3, 2, 7] = float("inf")
    with pytest.raises(BatchValidationError, match=r"2 sample.*value -inf.*'k1', 'k3'$"):
        validate_batch(batch, SCHEMA)


def test_out_of_range_names_keys_and_extremes():
    batch = make_batch()
    batch["label"] = torch.tensor([0, -1, 2, 7])
    with pytest.raises(
        BatchValidationError,
        match=r"field 'label' failed rule 'range': 2 sample\(s\) outside \[0, 4\]: min offending "
        r"value -1, max offending value 7; sample\(s\): 'k1', 'k3'$",
    ) as info:
        validate_batch(batch, SCHEMA)
    assert info.value.keys == ["k1", "k3"]
    batch = make_batch()
    batch["score"] = [0.5, 1.5, 0.2, -0.25]  # a JSON field kept as a list
    with pytest.raises(
        BatchValidationError, match=r"'score'.*-0.25, max offending value 1.5.*'k3'"
    ):
        validate_batch(batch, SCHEMA)
    batch["score"] = torch.tensor([0.5, 2.0, 0.2, 0.0])
    with pytest.raises(BatchValidationError, match=r"'score'.*value 2.0.*sample\(s\): 'k1'$"):
        validate_batch(batch, SCHEMA)


def test_rules_run_in_order_and_rows_fall_back_to_positions():
    batch = make_batch(b=8)
    del batch["__key__"]
    batch["emb"][:] = float("nan")
    batch["label"][:] = 9
    with pytest.raises(BatchValidationError, match=r"'finite'.*'#4' and 3 more \(8 samples\)$"):
        validate_batch(batch, SCHEMA)  # finiteness is checked before ranges
    batch["text"] = "not a list"
    with pytest.raises(BatchValidationError, match="'dtype'"):
        validate_batch(batch, SCHEMA)  # dtypes before finiteness
    with pytest.raises(BatchValidationError, match="rule 'type'"):
        validate_batch([1, 2], SCHEMA)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_on_cuda():
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in make_batch().items()}
    assert validate_batch(batch, SCHEMA, dims=DIMS)
    batch["emb"][3, 1] = float("nan")
    with pytest.raises(BatchValidationError, match=r"'finite'.*'k3'$"):
        validate_batch(batch, SCHEMA, dims=DIMS)


# -- datasets ------------------------------------------------------------------------------------
def _items(n: int = 40) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "__key__": f"s{i:04d}",
            "emb": rng.standard_normal(8).astype(np.float32),
            "negs": rng.standard_normal((3, 8)).astype(np.float32),
            "label": i % 5,
            "score": round(i / 40, 3),
            "text": f"t{i}",
        }
        for i in range(n)
    ]


BUILD_SCHEMA = {
    "emb": {"shape": ["D"]},
    "negs": {"shape": ["N_neg", "D"]},
    "label": {"range": [0, 4]},
    "score": {"range": [0, 1]},
}


@pytest.fixture()
def built(tmp_path):
    root = str(tmp_path / "built")
    manifest = build_shards(_items(), root, schema=BUILD_SCHEMA, shard_max_count=16)
    return root, manifest


@pytest.fixture()
def factory(tmp_path):
    root = str(tmp_path / "factory")
    write_dataset(root, {"train": [6, 6, 6, 6, 6], "val": [4]})
    return root


def _member(root: str, manifest: Manifest, key: str, ext: str) -> tuple[str, int, int]:
    """``(shard path, data offset, size)`` of member ``key.ext``."""
    for split in manifest.splits.values():
        for shard in split.shards:
            with open(os.path.join(root, shard.path), "rb") as f:
                data = f.read()
            for k, _, fields in iter_samples(data):
                if k == key:
                    return shard.path, *fields[ext]
    raise KeyError(key)


def _patch(path: str, offset: int, data: bytes) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    assert os.path.getsize(path) == size


def test_clean_dataset_is_ok(factory, built):
    report = validate_dataset(factory)
    assert isinstance(report, ValidationReport)
    assert report.ok and report.problems == []
    assert (report.shards_checked, report.samples_checked) == (6, 34)
    deep = validate_dataset(factory, deep=True, progress=True)
    assert deep.ok and (deep.shards_checked, deep.samples_checked) == (6, 34)
    report = validate_dataset(built[0], deep=True)
    assert report.ok, report.problems
    assert report.samples_checked == 40
    only_val = validate_dataset(factory, "val")
    assert only_val.ok and (only_val.shards_checked, only_val.samples_checked) == (1, 4)


def test_every_file_problem_is_reported(factory):
    m = Manifest.load(factory)
    tr = m.splits["train"].shards
    p = lambda rel: os.path.join(factory, rel)  # noqa: E731
    cut = int(np.fromfile(p(tr[0].idx_path), dtype="<u8")[3]) + 700
    with open(p(tr[0].path), "r+b") as f:  # truncated in the middle of sample #3
        f.truncate(cut)
    data = bytearray(open(p(tr[1].path), "rb").read())  # one flipped byte
    data[700] ^= 0x01
    open(p(tr[1].path), "wb").write(bytes(data))
    offsets = np.fromfile(p(tr[2].idx_path), dtype="<u8")  # two offsets swapped
    offsets[[1, 2]] = offsets[[2, 1]]
    offsets.tofile(p(tr[2].idx_path))
    os.remove(p(tr[3].idx_path))
    os.remove(p(m.splits["val"].shards[0].path))

    report = validate_dataset(factory)
    lines = report.problems
    assert not report.ok and report.shards_checked == 6
    expect = [
        f"{tr[0].path}: rule size: file has {cut} bytes, the manifest says {tr[0].num_bytes}",
        f"{tr[1].path}: rule sha256: file hashes to ",
        f"{tr[2].idx_path}: rule index: offsets are not strictly increasing: #1 is",
        f"{tr[3].idx_path}: rule index: index file not found (shard {tr[3].path})",
        "val/shard-000000.tar: rule missing: shard file not found",
    ]
    for text in expect:
        assert sum(line.startswith(text) for line in lines) == 1, (text, lines)
    assert len(lines) == len(expect)
    assert not any(tr[4].path in line for line in lines)

    deep = validate_dataset(factory, "train", deep=True)
    for text in expect[:4]:
        assert any(line.startswith(text) for line in deep.problems), (text, deep.problems)
    truncated = [line for line in deep.problems if "rule truncated" in line]
    assert truncated == [
        f"{tr[0].path}: rule truncated: samples #3..#5 end past the file's {cut} bytes; not read"
    ]
    assert deep.samples_checked == 3 + 6 + 6  # shard 0 in part, 1 and 4 whole (2, 3: no index)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda o, n: o[:-1], r"index has 48 bytes, expected 56 \(6 samples \+ 1 end offset\)"),
        (lambda o, n: np.concatenate([o[:3], o[3:4] + 1, o[4:]]), r"offset #3 \(\d+\) is not on"),
        (lambda o, n: np.concatenate([o[:-1], [n + 512]]), r"end offset \d+ lies past the end"),
        (lambda o, n: np.concatenate([[n + 512], o[1:]]), r"first offset \d+ lies past"),
    ],
    ids=["short", "unaligned", "end-past-file", "first-past-file"],
)
def test_bad_index_is_reported(factory, corrupt, message):
    shard = Manifest.load(factory).splits["train"].shards[2]
    path = os.path.join(factory, shard.idx_path)
    offsets = np.fromfile(path, dtype="<u8")
    np.asarray(corrupt(offsets, shard.num_bytes), dtype="<u8").tofile(path)
    report = validate_dataset(factory, deep=True)
    assert report.problems, "a bad index must be reported"
    assert all(line.startswith(f"{shard.idx_path}: rule index: ") for line in report.problems)
    assert any(re.search(message, line) for line in report.problems)
    assert report.samples_checked == 28  # the other shards were read in full


def test_deep_finds_nan_and_out_of_range_values_in_place(built):
    root, manifest = built
    rel, off, size = _member(root, manifest, "s0003", "emb.npy")
    _patch(os.path.join(root, rel), off + size - 8, np.array([np.nan], "<f4").tobytes())
    rel5, off, size = _member(root, manifest, "s0007", "label.cls")
    assert size == 1
    _patch(os.path.join(root, rel5), off, b"9")
    rel6, off, size = _member(root, manifest, "s0020", "score.json")
    _patch(os.path.join(root, rel6), off, b"7")  # "0.5" -> "7.5"

    shallow = validate_dataset(root)
    assert len(shallow.problems) == len({rel, rel5, rel6})
    assert all("rule sha256" in line for line in shallow.problems)

    lines = validate_dataset(root, deep=True).problems
    assert (
        f"{rel}: sample 's0003', field 'emb', rule finite: NaN/Inf, first offending value nan"
        in (lines)
    )
    assert (
        f"{rel5}: sample 's0007', field 'label', rule range: outside [0, 4]: min offending "
        "value 9, max offending value 9" in lines
    )
    assert (
        f"{rel6}: sample 's0020', field 'score', rule range: outside [0, 1]: min offending value "
        "7.5, max offending value 7.5" in lines
    )
    assert sum("rule sha256" in line for line in lines) == len({rel, rel5, rel6})
    assert len(lines) == 3 + len({rel, rel5, rel6})


def test_deep_reports_undecodable_members_and_goes_on(built):
    root, manifest = built
    rel, off, _ = _member(root, manifest, "s0002", "negs.npy")
    _patch(os.path.join(root, rel), off, b"XXXXXX")  # the .npy magic
    rel2, off, _ = _member(root, manifest, "s0009", "emb.npy")
    _patch(os.path.join(root, rel2), off + 128, np.full(8, np.inf, "<f4").tobytes())
    report = validate_dataset(root, deep=True)
    decode = [line for line in report.problems if "rule decode" in line]
    assert len(decode) == 1
    assert decode[0].startswith(f"{rel}: sample 's0002', field 'negs', rule decode: ")
    assert "not a .npy file" in decode[0]
    assert (
        f"{rel2}: sample 's0009', field 'emb', rule finite: NaN/Inf, first offending value inf"
        in (report.problems)
    )
    assert report.samples_checked == 40


def test_deep_checks_symbolic_dims_against_the_manifest_and_caps_lines(built):
    root, manifest = built
    manifest.dims["D"] = 9
    manifest.save(root)
    report = validate_dataset(root, deep=True)
    first = manifest.splits["train"].shards[0]
    lines = [line for line in report.problems if line.startswith(first.path + ":")]
    emb = [line for line in lines if ": sample " in line and "field 'emb', rule shape" in line]
    assert len(emb) == 10  # 16 samples: 10 lines, then one line counting the rest
    assert emb[0] == (
        f"{first.path}: sample 's0000', field 'emb', rule shape: D=8 (per-sample shape [8]), "
        "but the manifest dims has D=9"
    )
    assert f"{first.path}: field 'emb', rule shape: 6 more sample(s) with this problem" in lines
    assert any("field 'negs', rule shape: D=8" in line for line in lines)


def test_deep_checks_layout(built):
    root, manifest = built
    shard = manifest.splits["train"].shards[0]
    shard.layout["emb.npy"][0] += 512
    manifest.save(root)
    lines = validate_dataset(root, "train", deep=True).problems
    assert len(lines) == 10 + 1  # 16 samples: 10 lines, then one line counting the rest
    assert lines[0].startswith(f"{shard.path}: sample 's0000', rule layout: member 'emb.npy'")
    assert lines[-1] == f"{shard.path}: rule layout: 6 more sample(s) with this problem"


def test_remote_dataset_through_fsspec():
    root = f"memory://validate-{uuid.uuid4().hex[:8]}/ds"
    manifest = write_dataset(root, {"train": [7, 5]})
    report = validate_dataset(root, deep=True)
    assert report.ok and report.samples_checked == 12
    fs, base = url_to_fs(root)
    shard = manifest.splits["train"].shards[1]
    data = bytearray(fs.cat_file(f"{base}/{shard.path}"))
    data[600] ^= 0xFF
    fs.pipe_file(f"{base}/{shard.path}", bytes(data))
    fs.rm(f"{base}/{manifest.splits['train'].shards[0].idx_path}")
    lines = validate_dataset(root, deep=True).problems
    assert any(line.startswith(f"{shard.path}: rule sha256") for line in lines)
    assert any("rule index: index file not found" in line for line in lines)


def test_manifest_problems_raise(tmp_path, factory):
    with pytest.raises(ManifestError, match="manifest not found"):
        validate_dataset(str(tmp_path / "nothing"))
    with pytest.raises(ManifestError, match=r"split 'test' not in the manifest; splits: \["):
        validate_dataset(factory, "test")


# -- validate_first_batch ------------------------------------------------------------------------
needs_peek = pytest.mark.skipif(
    not (
        hasattr(ShardStreamDataset, "peek_batch") and hasattr(ShardStreamDataset, "output_schema")
    ),
    reason="ShardStreamDataset.peek_batch/output_schema are being added in parallel",
)


def test_first_batch_needs_a_wdsloader_loader(factory):
    with pytest.raises(TypeError, match="create_loader"):
        validate_first_batch(DataLoader(list(range(4)), batch_size=2))
    with pytest.raises(TypeError, match="create_loader"):
        validate_first_batch(object())


@needs_peek
def test_first_batch_validates_without_consuming(factory):
    loader = create_loader(factory, "train", batch_size=4, drop_last=False)
    assert validate_first_batch(loader) is True
    fresh = create_loader(factory, "train", batch_size=4, drop_last=False)
    after = [b["__key__"] for b in loader]
    assert after == [b["__key__"] for b in fresh]


@needs_peek
def test_first_batch_reports_a_schema_violation(built):
    root, manifest = built
    manifest.schema["label"].range = [0, 0]
    manifest.save(root)
    loader = create_loader(root, "train", batch_size=8, shuffle=False)
    with pytest.raises(BatchValidationError, match=r"field 'label' failed rule 'range'"):
        validate_first_batch(loader)


def test_loader_batch_passes_the_manifest_schema(factory, built):
    for root in (factory, built[0]):
        manifest = Manifest.load(root)
        for batch in create_loader(root, "train", batch_size=5, drop_last=False):
            assert validate_batch(batch, manifest.schema, dims=manifest.dims)


# -- command line --------------------------------------------------------------------------------
def test_cli_validate_counts_in_the_singular(factory, tmp_path, capsys):
    root = tmp_path / "ds"
    shutil.copytree(factory, root)
    shard = Manifest.load(str(root)).splits["val"].shards[0]
    data = bytearray((root / shard.path).read_bytes())
    data[-1] ^= 1  # in the end-of-archive padding: only the sha256 changes
    (root / shard.path).write_bytes(bytes(data))
    assert main(["validate", str(root), "--split", "val"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and "rule sha256" in out[0]
    assert out[-1] == f"1 problem in {root}: 1 shard, 4 samples checked"


def test_cli_validate_exit_codes(factory, tmp_path, capsys):
    assert main(["validate", factory]) == 0
    assert capsys.readouterr().out.strip() == "OK: 6 shards, 34 samples checked"
    assert main(["validate", factory, "--split", "val", "--deep"]) == 0
    assert capsys.readouterr().out.strip() == "OK: 1 shard, 4 samples checked (deep)"

    shard = Manifest.load(factory).splits["train"].shards[1]
    os.remove(os.path.join(factory, shard.path))
    os.remove(os.path.join(factory, shard.idx_path))
    assert main(["validate", factory, "--deep"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[:2] == [
        f"{shard.path}: rule missing: shard file not found",
        f"{shard.idx_path}: rule index: index file not found (shard {shard.path})",
    ]
    assert out[-1] == f"2 problems in {factory}: 6 shards, 28 samples checked (deep)"

    assert main(["validate", str(tmp_path / "nothing")]) == 2
    assert "manifest not found" in capsys.readouterr().err
    assert main(["validate", factory, "--split", "nope"]) == 2
    assert "split 'nope' not in the manifest" in capsys.readouterr().err
    assert main(["validate", factory, "--storage-option", "oops"]) == 2


def test_cli_bench_is_wired(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--split", "--num-workers", "--batch-size", "--max-batches", "--storage-option"):
        assert flag in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "wdsloader validate ./my_dataset" in capsys.readouterr().out


def test_manifest_json_is_untouched_by_validation(factory):
    before = open(os.path.join(factory, "manifest.json")).read()
    validate_dataset(factory, deep=True)
    assert json.loads(open(os.path.join(factory, "manifest.json")).read()) == json.loads(before)


def test_http_dataset_sizes_come_from_the_store_listing(http_server):
    """validate_dataset takes sizes from the store's listing (names unquoted): a shard whose name
    an HTTP listing quotes is found there, not probed with a request of its own."""
    folder = http_server.root / "ds"
    write_dataset(str(folder), {"train": [4, 3]})
    raw = json.loads((folder / "manifest.json").read_text())
    for shard in raw["splits"]["train"]["shards"]:
        old = shard["path"]
        shard["path"] = old.replace("shard-", "shard ")
        (folder / old).rename(folder / shard["path"])
    (folder / "manifest.json").write_text(json.dumps(raw))
    http_server.clear_log()
    report = validate_dataset(f"{http_server.url}/ds")
    assert report.ok, report.problems
    assert report.shards_checked == 2
    assert [r.path for r in http_server.requests() if r.method == "HEAD"] == []


def test_deep_validation_of_pickle_members_needs_the_explicit_opt_in(tmp_path, capsys):
    """An adopted dataset of ``.pyd`` members (webdataset's pickles) fails ``--deep`` by default
    (pickle is never decoded unasked) and passes with ``--allow-pickle`` / ``allow_pickle=True``."""
    import io
    import tarfile

    from build_shards.adopt import adopt

    root = tmp_path / "pyd"
    root.mkdir()
    with tarfile.open(root / "s.tar", "w") as tf:
        for i in range(3):
            for ext, data in (("pyd", pickle.dumps({"i": i})), ("txt", b"t")):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    adopt(root)
    refused = validate_dataset(str(root), deep=True)
    assert len(refused.problems) == 3
    assert refused.problems[0].startswith("s.tar: sample 'k0', field 'pyd', rule decode: ")
    assert "pickle members can run arbitrary code" in refused.problems[0]
    assert validate_dataset(str(root), deep=True, allow_pickle=True).ok
    assert main(["validate", str(root), "--deep"]) == 1
    capsys.readouterr()
    assert main(["validate", str(root), "--deep", "--allow-pickle"]) == 0
    assert capsys.readouterr().out.strip() == "OK: 1 shard, 3 samples checked (deep)"
