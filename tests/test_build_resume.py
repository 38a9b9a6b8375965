"""Layout independent of workers; crash (SIGKILL) and resume; options fingerprint."""

from __future__ import annotations

import copy
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from build_shards import BuildError, SourceChangedError, build_shards
from build_shards.write.records import BlockRecord, RecordError
from build_shards.write.sink import ShardSink
from wdsloader.errors import SchemaError
from wdsloader.format import Manifest

REPO = Path(__file__).resolve().parents[1]


def items(n: int) -> list[dict]:
    return [
        {
            "vec": np.arange(16, dtype=np.float32) + i,
            "text": "x" * (i % 37),
            "i": i,
            "group": f"g{i // 3}",
        }
        for i in range(n)
    ]


def stream(n: int, fail_at: int | None = None):
    for i, sample in enumerate(items(n)):
        if i == fail_at:
            raise OSError(f"input went away at item {i}")
        yield sample


def add_square(sample: dict) -> dict:
    """A module-level (picklable) map."""
    return {**sample, "sq": sample["i"] ** 2}


class KillAt:
    """A map that SIGKILLs the whole build (its process group) when it meets item ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self, sample: dict) -> dict:
        if sample["i"] == self.at:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return sample


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def manifest_without_time(root: Path) -> dict:
    d = copy.deepcopy(Manifest.load(root).to_dict())
    d["build"].pop("created")
    return d


def assert_same_build(a: Path, b: Path, *, same_source_kind: bool = True) -> None:
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb)
    assert all(fa[k] == fb[k] for k in fa), [k for k in fa if fa[k] != fb[k]]
    ma, mb = manifest_without_time(a), manifest_without_time(b)
    if not same_source_kind:
        assert ma["build"].pop("source") != mb["build"].pop("source")
    assert ma == mb


pytestmark = pytest.mark.usefixtures("infer_first_sample_only")
OPTS = dict(
    splits={"train": 0.6, "val": 0.2, "test": 0.2},
    group_by="group",
    shard_max_count=9,
    shard_max_bytes=40_000,
    block_size=40,
)


@pytest.mark.slow
@pytest.mark.usefixtures("build_workers")
def test_workers_do_not_change_a_single_byte(tmp_path):
    build_shards(items(300), tmp_path / "w1", map=add_square, workers=1, **OPTS)
    calls: list[tuple[int, int]] = []
    build_shards(
        items(300),
        tmp_path / "w3",
        map=add_square,
        workers=3,
        progress=lambda done, total: calls.append((done, total)),
        **OPTS,
    )
    assert calls[-1] == (300, 300)  # workers report progress through a queue
    assert_same_build(tmp_path / "w1", tmp_path / "w3")
    m = Manifest.load(tmp_path / "w1")
    assert m.num_samples == 300 and len(m.splits["train"].shards) > 8
    assert "workers" not in m.build
    # sequential sources: the parent reads, workers build
    build_shards(stream(300), tmp_path / "g2", map=add_square, workers=2, **OPTS)
    assert_same_build(tmp_path / "w1", tmp_path / "g2", same_source_kind=False)


def test_lambda_map_with_workers_is_a_clear_error(tmp_path):
    with pytest.raises(BuildError, match="picklable map"):
        build_shards(items(10), tmp_path / "ds", map=lambda s: s, workers=2)


def _stats(root: Path, paths: list[str]) -> dict[str, tuple[int, int]]:
    return {p: ((root / p).stat().st_ino, (root / p).stat().st_mtime_ns) for p in paths}


def _finished_blocks(root: Path) -> dict[str, list[str]]:
    out = {}
    for rec_path in sorted((root / "_build").glob("block-*.json")):
        rec = json.loads(rec_path.read_text())
        out[rec_path.name] = [
            p
            for shards in rec["splits"].values()
            for s in shards
            for p in (s["path"], s["idx_path"])
        ]
    return out


def test_crash_of_a_sequential_source_resumes_and_keeps_finished_shards(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(stream(200, fail_at=130), out, **OPTS)
    assert not (out / "manifest.json").exists()
    finished = _finished_blocks(out)
    assert sorted(finished) == [f"block-{b:05d}.json" for b in range(3)]
    kept = [p for paths in finished.values() for p in paths]
    before = _stats(out, kept)
    stray = out / "train" / "train-00003-000.tar.tmp-0123456789ab"
    stray.write_bytes(b"half a shard")
    # a finished block whose shard went missing is redone
    redo = finished["block-00002.json"][0]
    (out / redo).unlink()
    with pytest.raises(BuildError, match="other options .*shard_max_count"):
        build_shards(stream(200), out, **{**OPTS, "shard_max_count": 10})
    build_shards(stream(200), out, **OPTS)
    build_shards(stream(200), ref, **OPTS)
    assert_same_build(out, ref)
    assert not stray.exists() and not (out / "_build").exists()
    redone = set(finished["block-00002.json"])
    after = _stats(out, [p for p in kept if p not in redone])
    assert after == {p: v for p, v in before.items() if p not in redone}
    assert len(after) >= 10


def test_other_options_restart_with_overwrite(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError):
        build_shards(stream(100, fail_at=90), out, **OPTS)
    assert (out / "_build" / "build.json").exists()
    m = build_shards(stream(100), out, overwrite=True, **{**OPTS, "block_size": 25})
    assert m.build["block_size"] == 25 and m.num_samples == 100
    names = {p.name for p in out.rglob("train-*.tar")}
    assert "train-00003-000.tar" in names  # four blocks of 25


@pytest.mark.slow
def test_sigkill_half_way_then_rerun_equals_an_uninterrupted_build(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    script = textwrap.dedent(
        f"""
        from build_shards import build_shards
        from build_shards.probe import infer
        from tests.test_build_resume import KillAt, OPTS, items
        infer.INFER_ROWS = 1  # see the infer_first_sample_only fixture
        build_shards(items(600), {str(out)!r}, map=KillAt(430), workers=2, **OPTS)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        start_new_session=True,  # the kill takes the build's process group, not pytest
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "manifest.json").exists()
    finished = _finished_blocks(out)
    # item 430 is in block 10 of 15: a worker takes it only after finishing earlier blocks
    assert 1 <= len(finished) < 15
    assert "block-00010.json" not in finished
    kept = [p for paths in finished.values() for p in paths]
    before = _stats(out, kept)
    assert list(out.glob("*/*-00010-*.tar.tmp-*"))  # block 10 died half-written

    build_shards(items(600), out, map=KillAt(-1), workers=2, **OPTS)
    build_shards(items(600), ref, map=KillAt(-1), workers=1, **OPTS)
    assert_same_build(out, ref)
    assert _stats(out, kept) == before  # finished blocks were not rewritten
    assert not list(out.rglob("*.tmp-*")) and not (out / "_build").exists()


@pytest.mark.slow
def test_a_schema_error_in_a_worker_stops_the_build_and_leaves_nothing(tmp_path):
    data = items(200)
    data[170]["vec"] = np.zeros(3, np.float32)
    with pytest.raises(SchemaError, match=r"sample '000000170': field 'vec': shape \[3\]"):
        build_shards(data, tmp_path / "ds", workers=2, **OPTS)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert not [p for p in (tmp_path / "ds").rglob("*") if p.is_file()]


# ------------------------------------------------------------------------------------------------
# a rerun must read the data the finished blocks were written from
# ------------------------------------------------------------------------------------------------


def changed_items(n: int, from_item: int) -> list[dict]:
    """``items(n)`` with other text from item ``from_item`` on (same length, keys and schema)."""
    out = items(n)
    for sample in out[from_item:]:
        sample["text"] = "y" * (sample["i"] % 37)
    return out


def disk_full_at(monkeypatch, n: int) -> list[str]:
    """Make the ``n``-th shard commit fail as a full disk does (the real commit's clean-up of its
    temporary file included); returns the shards committed so far."""
    real = ShardSink._commit
    calls: list[str] = []

    def commit(self, f, tmp, rel, *indexes):
        calls.append(rel)
        if len(calls) == n:
            f.close()
            os.remove(tmp)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
        return real(self, f, tmp, rel, *indexes)

    monkeypatch.setattr(ShardSink, "_commit", commit)
    return calls


def test_a_rerun_with_changed_content_of_an_indexable_source_is_refused(tmp_path, monkeypatch):
    out, ref = tmp_path / "out", tmp_path / "ref"
    disk_full_at(monkeypatch, 14)  # in block 2: blocks 0 and 1 (6 shards each) finished
    with pytest.raises(OSError, match="No space left on device") as info:
        build_shards(items(200), out, **OPTS)
    assert "rerun with the same options to resume" in info.value.__notes__[0]
    assert not list(out.rglob("*.tmp-*"))  # the failed block's files are gone, finished ones kept
    monkeypatch.undo()
    finished = _finished_blocks(out)
    assert sorted(finished) == ["block-00000.json", "block-00001.json"]
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    # same kind, length, keys and schema; other content from item 60 on (block 1 holds 40-79)
    msg = (
        r"finished block 1 of the unfinished build \(source items 40-79\) was written from "
        r"other data: source item 79, the block's last item, differs \(sample '000000079' has "
        r"other content or split .*pass overwrite=True to start over"
    )
    with pytest.raises(SourceChangedError, match=msg):
        build_shards(changed_items(200, 60), out, **OPTS)
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    assert after == before  # refused before writing anything
    # the data it was written from resumes; the changed data starts over with overwrite
    build_shards(items(200), out, **OPTS)
    build_shards(items(200), ref, **OPTS)
    assert_same_build(out, ref)
    build_shards(changed_items(200, 60), out, overwrite=True, **OPTS)
    build_shards(changed_items(200, 60), ref, overwrite=True, **OPTS)
    assert_same_build(out, ref)


def test_a_rerun_with_a_changed_stream_never_mixes_old_and_new_samples(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(stream(200, fail_at=130), out, **OPTS)
    assert len(_finished_blocks(out)) == 3  # items 0-119
    with pytest.raises(SourceChangedError, match=r"block 2 .*source item 119, the block's last"):
        build_shards(iter(changed_items(200, 100)), out, **OPTS)
    assert not (out / "manifest.json").exists()
    with pytest.raises(SourceChangedError, match="source ended before item 119, the last item of"):
        build_shards(stream(100), out, **OPTS)  # a shorter stream: block 2 is not all there
    assert not (out / "manifest.json").exists()
    build_shards(iter(changed_items(200, 100)), out, overwrite=True, **OPTS)
    build_shards(iter(changed_items(200, 100)), ref, **OPTS)
    assert_same_build(out, ref)


def test_unreadable_block_records_are_redone_never_a_crash(tmp_path, caplog):
    out, ref = tmp_path / "out", tmp_path / "ref"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(stream(200, fail_at=130), out, **OPTS)
    records = sorted((out / "_build").glob("block-*.json"))
    assert [p.name for p in records] == ["block-00000.json", "block-00001.json", "block-00002.json"]
    body = json.loads(records[1].read_text())
    records[0].write_text("{not json")
    records[1].write_text(json.dumps({**body, "splits": list(body["splits"].values())}))
    body2 = json.loads(records[2].read_text())
    records[2].write_text(json.dumps({**body2, "first": {**body2["first"], "index": "80"}}))
    caplog.set_level("WARNING", logger="build_shards")
    build_shards(stream(200), out, **OPTS)
    build_shards(stream(200), ref, **OPTS)
    assert_same_build(out, ref)
    warned = [r.getMessage() for r in caplog.records if "redoing its block" in r.getMessage()]
    assert len(warned) == 3
    assert "block-00001.json is unreadable (splits is a list, not an object)" in warned[1]
    assert "block-00002.json is unreadable (index is '80', not an int)" in warned[2]


def test_a_block_record_reads_back_what_it_wrote(tmp_path):
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(stream(200, fail_at=130), tmp_path / "out", **OPTS)
    for path in sorted((tmp_path / "out" / "_build").glob("block-*.json")):
        on_disk = json.loads(path.read_bytes())
        rec = BlockRecord.from_json(path.read_bytes())
        assert rec.to_dict() == on_disk and rec.to_json() == path.read_bytes()
        assert rec.num_samples == sum(s.num_samples for s in rec.all_shards())
        compact = rec.compact()
        assert compact.keys is None
        assert {s: len(h) for s, h in compact.key_hashes.items()} == {
            s: len(ks) for s, ks in rec.keys.items()
        }
    with pytest.raises(RecordError, match="block record is a list"):
        BlockRecord.from_dict([])


def test_the_fingerprint_options_and_manifest_build_share_their_parameters(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError, match="went away at item 130"):
        build_shards(stream(200, fail_at=130), out, seed=5, **OPTS)
    options = json.loads((out / "_build" / "build.json").read_text())["options"]
    build_shards(stream(200), out, seed=5, **OPTS)
    build = Manifest.load(out).build
    shared = sorted(set(options) & set(build) - {"source"})  # build["source"] holds counts
    assert shared == [
        "allow_nan",
        "block_size",
        "key_field",
        "seed",
        "shard_max_bytes",
        "shard_max_count",
        "splits",
    ]
    assert {k: options[k] for k in shared} == {k: build[k] for k in shared}
    assert build["seed"] == 5 and build["block_size"] == 40


def test_a_crash_while_packing_the_remainders_resumes_to_the_same_build(
    tmp_path, monkeypatch, caplog
):
    import build_shards.write.rests as rests

    real, calls = rests._samples, []

    def fail_third(fs, root, info, compression):
        calls.append(info.path)
        if len(calls) == 3:
            raise OSError("the disk went away while packing")
        return real(fs, root, info, compression)

    monkeypatch.setattr(rests, "_samples", fail_third)
    with pytest.raises(OSError, match="while packing") as err:
        build_shards(items(200), tmp_path / "out", **OPTS)
    assert "rerun with the same options to resume" in str(err.value.__notes__)
    # every block finished: their records and remainders are kept for the rerun
    assert len(list((tmp_path / "out" / "_build").glob("block-*.json"))) == 5
    assert list((tmp_path / "out" / "_build" / "rest").rglob("*.tar"))
    monkeypatch.setattr(rests, "_samples", real)
    caplog.set_level("INFO", logger="build_shards")
    build_shards(items(200), tmp_path / "out", **OPTS)
    # test's only remainder (block 0's) was moved into place before the crash: block 0 is
    # redone, the other four are kept
    assert "4 finished blocks kept" in caplog.text
    build_shards(items(200), tmp_path / "ref", **OPTS)
    assert_same_build(tmp_path / "out", tmp_path / "ref")
