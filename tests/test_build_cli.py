"""The ``build-shards`` command line: summaries on success, one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from build_shards.cli import main
from build_shards.cli.parser import parse_size, parse_splits
from wdsloader.format import Manifest
from wdsloader.io.storage import parse_storage_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("build-shards: error: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def nothing_left(output) -> None:
    """No manifest and no visible shard under ``output``."""
    if not os.path.exists(output):
        return
    for dirpath, _, names in os.walk(output):
        for name in names:
            assert name != "manifest.json", os.path.join(dirpath, name)
            assert not name.endswith(".tar"), os.path.join(dirpath, name)


def write_jsonl(path, n: int, bad_line: int | None = None) -> None:
    with open(path, "w") as f:
        for i in range(1, n + 1):
            if i == bad_line:
                f.write('{"id": 3, "text": unquoted}\n')
            else:
                f.write(json.dumps({"id": i, "text": f"sample number {i}", "score": i / 2}) + "\n")


def summary_rows(out: str) -> dict[str, tuple[int, int]]:
    """``{split: (shards, samples)}`` parsed from the summary table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1].replace(",", "").isdigit():
            rows[parts[0]] = (int(parts[1].replace(",", "")), int(parts[2].replace(",", "")))
    return rows


# -- option values -------------------------------------------------------------------------------
def test_option_parsers():
    assert parse_size("256MB") == 256_000_000
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("1.5k") == 1500
    assert parse_size("4096") == 4096
    assert parse_splits("train=0.8,val=0.1,test=0.1") == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert parse_storage_options(
        ["anon=true", "client_kwargs.endpoint_url=http://h:9", "client_kwargs.region_name=x"]
    ) == {"anon": True, "client_kwargs": {"endpoint_url": "http://h:9", "region_name": "x"}}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--shard-max-bytes", "12XB"], "--shard-max-bytes"),
        (["--splits", "train=abc"], "--splits"),
        (["--splits", "train"], "--splits"),
        (["--workers", "0"], "--workers"),
        (["--format", "parquet"], "--format"),
        (["--storage-option", "novalue"], "--storage-option"),
    ],
)
def test_bad_option_values(tmp_path, capsys, argv, needle):
    write_jsonl(tmp_path / "a.jsonl", 5)
    code, _, err = run_cli(capsys, "build", tmp_path / "a.jsonl", "-o", tmp_path / "out", *argv)
    assert_one_line_error(code, err, needle)
    nothing_left(tmp_path / "out")


def test_missing_input_and_command(tmp_path, capsys):
    code, _, err = run_cli(capsys, "build", tmp_path / "nope.jsonl", "-o", tmp_path / "out")
    assert_one_line_error(code, err, "nope.jsonl")
    assert not (tmp_path / "out").exists()
    code, _, err = run_cli(capsys, "build", str(tmp_path / "*.jsonl"), "-o", tmp_path / "out")
    assert_one_line_error(code, err, "*.jsonl")
    code, _, err = run_cli(capsys)
    assert_one_line_error(code, err, "COMMAND")
    code, _, err = run_cli(capsys, "text", tmp_path / "x.txt", "-o", tmp_path / "o")
    assert_one_line_error(code, err, "--tokenizer", "--seq-length")


# -- build ---------------------------------------------------------------------------------------
def test_build_prints_summary_with_counts(tmp_path, capsys):
    write_jsonl(tmp_path / "a.jsonl", 120)
    out_dir = tmp_path / "ds"
    code, out, err = run_cli(
        capsys,
        "build",
        tmp_path / "a.jsonl",
        "-o",
        out_dir,
        "--splits",
        "train=0.75,val=0.25",
        "--shard-max-count",
        "20",
        "--seed",
        "3",
    )
    assert code == 0, err
    manifest = Manifest.load(out_dir)
    rows = summary_rows(out)
    assert set(rows) == {"train", "val", "total"}
    for name, split in manifest.splits.items():
        assert rows[name] == (len(split.shards), split.num_samples)
    assert rows["total"][1] == 120 == manifest.num_samples
    assert "samples/s" in out and "MB/s" in out

    # the same output again without --overwrite: one line, the dataset stays as it was
    before = (out_dir / "manifest.json").read_bytes()
    code, _, err = run_cli(capsys, "build", tmp_path / "a.jsonl", "-o", out_dir)
    assert_one_line_error(code, err, str(out_dir))
    assert (out_dir / "manifest.json").read_bytes() == before
    code, out, err = run_cli(capsys, "build", tmp_path / "a.jsonl", "-o", out_dir, "--overwrite")
    assert code == 0, err
    assert summary_rows(out)["total"][1] == 120


def test_schema_file_declares_fields_json_and_yaml(tmp_path, capsys, monkeypatch):
    from build_shards.probe import infer

    monkeypatch.setattr(infer, "INFER_ROWS", 2)  # "v" turns float and "w" appears later
    rows = [{"v": 1}, {"v": 2}, {"v": 2.5, "w": "x"}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run_cli(capsys, "build", tmp_path / "a.jsonl", "-o", tmp_path / "no")
    assert_one_line_error(code, err, "unexpected ['w']", "--schema FILE", '"optional": true')
    spec = {
        "v": {"encoding": "json", "dtype": "float64"},
        "w": {"encoding": "txt", "optional": True},
    }
    (tmp_path / "s.json").write_text(json.dumps(spec))
    (tmp_path / "s.yaml").write_text(
        "v: {encoding: json, dtype: float64}\nw:\n  encoding: txt\n  optional: true\n"
    )
    for name in ("s.json", "s.yaml"):
        out_dir = tmp_path / f"ds-{name}"
        argv = ("build", tmp_path / "a.jsonl", "-o", out_dir, "--schema", tmp_path / name)
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, err
        schema = Manifest.load(out_dir).schema
        assert (schema["v"].encoding, schema["v"].dtype, schema["w"].optional) == (
            "json",
            "float64",
            True,
        )
    (tmp_path / "bad.json").write_text('["v"]')
    code, _, err = run_cli(
        capsys,
        "build",
        tmp_path / "a.jsonl",
        "-o",
        tmp_path / "x",
        "--schema",
        tmp_path / "bad.json",
    )
    assert_one_line_error(code, err, "bad.json: expected an object of field -> spec")
    code, _, err = run_cli(
        capsys, "build", tmp_path / "a.jsonl", "-o", tmp_path / "x", "--schema", tmp_path / "none"
    )
    assert_one_line_error(code, err, "--schema", "No such file")
    assert not (tmp_path / "x").exists()


def test_small_rows_print_the_small_record_options_once_at_the_end(tmp_path, capsys):
    rows = [{"a": i, "b": "x", "c": 0.5} for i in range(300)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    input_bytes = (tmp_path / "s.jsonl").stat().st_size
    code, out, err = run_cli(capsys, "build", tmp_path / "s.jsonl", "-o", tmp_path / "plain")
    assert code == 0, err
    shards = Manifest.load(tmp_path / "plain").num_bytes
    assert shards > 40 * input_bytes
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("hint:")] == [lines[-1]]
    assert lines[-1].startswith(f"hint: the shards take {shards / input_bytes:.0f}x the input's")
    assert lines[-1].endswith(
        "--group-small-fields --compression gzip make such shards much smaller"
    )
    code, out, err = run_cli(
        capsys, "build", tmp_path / "s.jsonl", "-o", tmp_path / "g", "--group-small-fields"
    )
    assert code == 0 and out.splitlines()[-1].endswith(
        "--compression gzip makes such shards much smaller"
    )
    argv = ("--group-small-fields", "--compression", "gzip")
    code, out, err = run_cli(capsys, "build", tmp_path / "s.jsonl", "-o", tmp_path / "gz", *argv)
    assert code == 0 and "hint:" not in out
    assert Manifest.load(tmp_path / "gz").num_bytes < shards / 20


def test_a_compressed_input_gets_no_small_record_hint(tmp_path, capsys):
    """Big text rows in a .jsonl.gz: the shards are many times the gzip file's bytes because the
    input is compressed, not because fields are small (the hint said 'each small field is a tar
    member of at least 1,024 bytes' and suggested --group-small-fields)."""
    import gzip

    rows = [{"text": f"row {i}: " + "the same words again " * 200} for i in range(50)]
    with gzip.open(tmp_path / "big.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(capsys, "build", tmp_path / "big.jsonl.gz", "-o", tmp_path / "ds")
    assert code == 0, err
    shards = Manifest.load(tmp_path / "ds").num_bytes
    assert shards > 40 * (tmp_path / "big.jsonl.gz").stat().st_size
    assert "hint:" not in out


def test_bad_jsonl_line_names_file_and_line(tmp_path, capsys):
    write_jsonl(tmp_path / "bad.jsonl", 60, bad_line=41)
    out_dir = tmp_path / "ds"
    code, _, err = run_cli(
        capsys, "build", tmp_path / "bad.jsonl", "-o", out_dir, "--shard-max-count", "5"
    )
    assert_one_line_error(code, err, "bad.jsonl:41")
    nothing_left(out_dir)


def test_empty_source(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    code, _, err = run_cli(capsys, "build", tmp_path / "empty.jsonl", "-o", tmp_path / "ds")
    assert_one_line_error(code, err)
    nothing_left(tmp_path / "ds")


def test_forced_text_format_and_hf_disk(tmp_path, capsys):
    (tmp_path / "notes.log").write_text("one\n\ntwo\n\nthree\n")
    code, out, err = run_cli(
        capsys, "build", tmp_path / "notes.log", "-o", tmp_path / "t", "--format", "text"
    )
    assert code == 0, err
    assert summary_rows(out)["total"][1] == 3

    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict(
        {"x": list(range(30)), "label": [i % 3 for i in range(30)]}
    ).save_to_disk(str(tmp_path / "hf"))
    code, out, err = run_cli(capsys, "build", tmp_path / "hf", "-o", tmp_path / "h")
    assert code == 0, err
    assert summary_rows(out)["total"][1] == 30


def test_a_disk_full_keeps_finished_blocks_and_the_same_command_resumes(
    tmp_path, capsys, monkeypatch
):
    from tests.test_build_resume import _stats, assert_same_build, disk_full_at

    write_jsonl(tmp_path / "a.jsonl", 200)
    out_dir, ref = tmp_path / "ds", tmp_path / "ref"
    argv = ["build", tmp_path / "a.jsonl", "--shard-max-count", "10", "--splits", "a=0.5,b=0.5"]
    disk_full_at(monkeypatch, 12)  # blocks of 40 items, 4 to 6 shards each: in block 2
    code, _, err = run_cli(capsys, *argv, "-o", out_dir)
    monkeypatch.undo()
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("build-shards: error: ") and "No space left on device" in err
    assert f"finished blocks are kept in {out_dir}: rerun with the same options to resume" in err
    records = sorted((out_dir / "_build").glob("block-*.json"))
    assert [p.name for p in records] == ["block-00000.json", "block-00001.json"]
    kept = [
        s[k]
        for p in records
        for shards in json.loads(p.read_text())["splits"].values()
        for s in shards
        for k in ("path", "idx_path")
    ]
    before = _stats(out_dir, kept)
    assert not (out_dir / "manifest.json").exists()
    code, _, err = run_cli(capsys, *argv, "-o", out_dir)
    assert code == 0, err
    assert _stats(out_dir, kept) == before  # kept, not rewritten
    assert run_cli(capsys, *argv, "-o", ref)[0] == 0
    assert_same_build(out_dir, ref)


def test_a_failed_overwrite_keeps_the_old_dataset(tmp_path, capsys):
    write_jsonl(tmp_path / "good.jsonl", 50)
    write_jsonl(tmp_path / "bad.jsonl", 60, bad_line=41)
    out_dir = tmp_path / "ds"
    assert run_cli(capsys, "build", tmp_path / "good.jsonl", "-o", out_dir)[0] == 0
    files = {p: p.read_bytes() for p in out_dir.rglob("*") if p.is_file()}
    code, _, err = run_cli(
        capsys, "build", tmp_path / "bad.jsonl", "-o", out_dir, "--overwrite",
        "--shard-max-count", "5",
    )  # fmt: skip
    assert_one_line_error(code, err, "bad.jsonl:41")
    assert {p: p.read_bytes() for p in out_dir.rglob("*") if p.is_file()} == files
    assert Manifest.load(out_dir).num_samples == 50


def test_errors_name_the_flags_not_the_python_arguments(tmp_path, capsys):
    (tmp_path / "nan.jsonl").write_text('{"id": 1, "v": [1.0, 2.0]}\n{"id": 2, "v": [NaN, 1.0]}\n')
    code, _, err = run_cli(capsys, "build", tmp_path / "nan.jsonl", "-o", tmp_path / "ds")
    assert_one_line_error(code, err, "sample '000000001': field 'v': NaN", "pass --allow-nan to")
    assert "allow_nan" not in err
    assert not (tmp_path / "ds").exists()
    assert (
        run_cli(capsys, "build", tmp_path / "nan.jsonl", "-o", tmp_path / "ds", "--allow-nan")[0]
        == 0
    )
    code, _, err = run_cli(capsys, "build", tmp_path / "nan.jsonl", "-o", tmp_path / "ds")
    assert_one_line_error(code, err, "pass --overwrite to replace it")
    assert "overwrite=" not in err
    # a build in progress: the lock is named, and how to break it
    (tmp_path / "ds2").mkdir()
    (tmp_path / "ds2" / "_build.lock").write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getppid(),
                "started": time.time(),
                "token": "x",
            }
        )
    )
    code, _, err = run_cli(capsys, "build", tmp_path / "nan.jsonl", "-o", tmp_path / "ds2")
    assert_one_line_error(code, err, f"{tmp_path / 'ds2'} is being written by another build")
    assert f"pid {os.getppid()}" in err and "pass --force-unlock" in err
    argv = ["build", tmp_path / "nan.jsonl", "-o", tmp_path / "ds2", "--allow-nan"]
    assert run_cli(capsys, *argv, "--force-unlock")[0] == 0


# -- text ----------------------------------------------------------------------------------------
@pytest.fixture()
def tokenizer_file(tmp_path):
    pytest.importorskip("tokenizers")
    from tests.test_build_text import train_tokenizer

    path = tmp_path / "tokenizer.json"
    train_tokenizer(["[UNK]", "[BOS]", "[EOS]"]).save(str(path))
    return path


def test_text_command(tmp_path, capsys, tokenizer_file):
    from build_shards.text import PackStats, iter_documents, load_tokenizer, pack_tokens
    from tests.test_build_text import make_corpus

    (tmp_path / "corpus.txt").write_text("\n\n".join(make_corpus(50)))
    stats = PackStats()
    docs = iter_documents(tmp_path / "corpus.txt")
    expected = list(
        pack_tokens(docs, load_tokenizer(tokenizer_file), seq_length=32, stride=16, stats=stats)
    )
    code, out, err = run_cli(
        capsys,
        "text",
        tmp_path / "corpus.txt",
        "-o",
        tmp_path / "lm",
        "--tokenizer",
        tokenizer_file,
        "--seq-length",
        "32",
        "--stride",
        "16",
    )
    assert code == 0, err
    assert summary_rows(out)["total"][1] == len(expected) == stats.chunks > 5
    manifest = Manifest.load(tmp_path / "lm")
    assert manifest.schema["tokens"].shape == [33]


def test_text_command_pack_documents_feeds_a_packing_loader(tmp_path, capsys, tokenizer_file):
    from tests.test_build_text import make_corpus
    from wdsloader import Packing, create_loader

    (tmp_path / "corpus.txt").write_text("\n\n".join(make_corpus(50)))
    code, out, err = run_cli(
        capsys, "text", tmp_path / "corpus.txt", "-o", tmp_path / "lm",
        "--tokenizer", tokenizer_file, "--seq-length", "32", "--pack", "documents",
    )  # fmt: skip
    assert code == 0, err
    assert summary_rows(out)["total"][1] == 50
    manifest = Manifest.load(tmp_path / "lm")
    assert manifest.build["lengths_field"] == "input_ids"
    assert manifest.build["text"]["pack"] == "documents"
    loader = create_loader(
        str(tmp_path / "lm"), "train", 2, packing=Packing(max_tokens=32), drop_last=False
    )
    docs = {d for b in loader for d in b["document_ids"].flatten().tolist() if d >= 0}
    assert docs == set(range(50))


def test_text_command_errors(tmp_path, capsys, tokenizer_file):
    (tmp_path / "tiny.txt").write_text("alpha beta\n")
    code, _, err = run_cli(
        capsys, "text", tmp_path / "tiny.txt", "-o", tmp_path / "lm",
        "--tokenizer", tmp_path / "missing.json", "--seq-length", "8",
    )  # fmt: skip
    assert_one_line_error(code, err, "missing.json")
    code, _, err = run_cli(
        capsys, "text", tmp_path / "tiny.txt", "-o", tmp_path / "lm",
        "--tokenizer", tokenizer_file, "--seq-length", "64",
    )  # fmt: skip
    assert_one_line_error(code, err, "tiny.txt", "fewer than one chunk")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n')
    code, _, err = run_cli(
        capsys, "text", tmp_path / "bad.jsonl", "-o", tmp_path / "lm",
        "--tokenizer", tokenizer_file, "--seq-length", "2",
    )  # fmt: skip
    assert_one_line_error(code, err, "bad.jsonl:2", "no field 'text'")
    nothing_left(tmp_path / "lm")


# -- adopt ---------------------------------------------------------------------------------------
def test_adopt_command(tmp_path, capsys):
    wds = pytest.importorskip("webdataset")
    for split, n in (("train", 9), ("val", 4)):
        (tmp_path / "s" / split).mkdir(parents=True)
        with wds.ShardWriter(
            str(tmp_path / "s" / split / "p-%02d.tar"), maxcount=5, verbose=0
        ) as w:
            for i in range(n):
                w.write({"__key__": f"{split}{i}", "txt": "x", "cls": i})
    code, out, err = run_cli(capsys, "adopt", tmp_path / "s", "--no-progress")
    assert code == 0, err
    assert summary_rows(out) == {"train": (2, 9), "val": (1, 4), "total": (3, 13)}
    assert "adopted" in out
    hidden = sorted(p.name for p in (tmp_path / "s" / "train").iterdir() if p.name[0] == ".")
    assert hidden == [
        ".p-00.tar.wdsidx",
        ".p-00.tar.wdskeys",
        ".p-01.tar.wdsidx",
        ".p-01.tar.wdskeys",
    ]
    code, out, _ = run_cli(capsys, "adopt", "--help")
    assert code == 0 and ".X.tar.wdsidx" in out and ".X.tar.wdskeys" in out
    code, _, err = run_cli(capsys, "adopt", tmp_path / "s")
    assert_one_line_error(code, err, "manifest.json already exists")
    code, _, err = run_cli(capsys, "adopt", tmp_path / "s", "--split-pattern", "(unclosed")
    assert_one_line_error(code, err, "split pattern")
    code, _, err = run_cli(capsys, "adopt", tmp_path / "nowhere")
    assert_one_line_error(code, err, "nowhere", "no such folder")


# -- a real process ------------------------------------------------------------------------------
def test_subprocess_help_and_error(tmp_path):
    cmd = [sys.executable, "-m", "build_shards.cli"]
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0
    assert "examples:" in done.stdout and "build-shards adopt" in done.stdout
    done = subprocess.run(
        [*cmd, "build", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("build-shards: error: ")
    assert done.stderr.count("\n") == 1 and "missing.jsonl" in done.stderr
    assert not (tmp_path / "out").exists()


def test_build_lengths_flag_records_each_samples_length(tmp_path, capsys):
    import fsspec

    from wdsloader.format.lengths import read_lengths

    rows = [{"id": i, "input_ids": list(range(i % 7))} for i in range(20)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ds"
    argv = ["build", tmp_path / "t.jsonl", "-o", out, "--lengths", "input_ids"]
    assert run_cli(capsys, *argv)[0] == 0
    manifest = Manifest.load(out)
    assert manifest.build["lengths_field"] == "input_ids"
    (shard,) = manifest.split("train").shards
    lengths = read_lengths(fsspec.filesystem("file"), str(out), shard)
    assert lengths.tolist() == [i % 7 for i in range(20)]
