"""group_small_fields=True: a sample's small fields as one member KEY.fields.json, declared in the
manifest; our loader yields the same fields, values and types as without grouping; small-record
shards within 2x the JSONL with grouping + gzip."""

from __future__ import annotations

import json
import logging
import subprocess

import numpy as np
import pytest

from build_shards import build_shards
from build_shards.cli import main
from wdsloader import create_loader
from wdsloader.errors import DecodeError
from wdsloader.format import Manifest

N = 40


def rows(n: int = N) -> list[dict]:
    return [
        {
            "__key__": f"r{i:04d}",
            "id": i,
            "question": f'what is the {i % 13}th prime after {i * 7 % 97}? ünïcode "q"',
            "label": np.int16(i % 10),
            "score": round((i * 37 % 1000) / 1000, 3),
            "ok": i % 2 == 0,
            "meta": {"i": i, "tags": ["a"] * (i % 3)},
            "long": "x" * 600 + str(i),
            "emb": np.full(3, i, dtype=np.float32),
        }
        for i in range(n)
    ]


def as_list(samples: list[dict]) -> list[dict]:
    return samples


def samples(root, **kw) -> list[dict]:
    loader = create_loader(
        str(root), "train", batch_size=8, shuffle=False, drop_last=False, collate_fn=as_list, **kw
    )
    return [s for batch in loader for s in batch]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("grouped")
    plain = build_shards(rows(), base / "plain", shard_max_count=16)
    grouped = build_shards(rows(), base / "grouped", shard_max_count=16, group_small_fields=True)
    return base, plain, grouped


def test_small_scalars_are_grouped_and_declared_the_rest_kept(pair):
    _base, plain, grouped = pair
    small = {"id", "label", "ok", "question", "score"}
    for name, spec in grouped.schema.items():
        was = plain.schema[name]
        if name in small:
            assert (spec.ext, spec.grouped) == ("fields.json", True), name
            assert (spec.encoding, spec.dtype) == (was.encoding, was.dtype), name
        else:
            assert spec == was, name  # a dict, a 600-byte string, an array: own members
    assert grouped.schema["label"].dtype == "int16"
    raw = json.loads(((pair[0] / "grouped") / "manifest.json").read_text())
    assert raw["version"] == "2.1" and raw["schema"]["id"]["grouped"] is True
    assert "grouped" not in raw["schema"]["meta"]


def test_the_loader_yields_the_same_fields_values_and_types(pair):
    base, _plain, _grouped = pair
    for gather in (True, False):
        got, want = samples(base / "grouped", gather=gather), samples(base / "plain")
        assert len(got) == len(want) == N
        for g, w in zip(got, want, strict=True):
            assert list(g) == list(w)
            for k in w:
                if isinstance(w[k], np.ndarray):
                    np.testing.assert_array_equal(g[k], w[k])
                else:
                    assert (g[k], type(g[k])) == (w[k], type(w[k])), k
    assert type(samples(base / "grouped")[3]["label"]) is np.int16


def test_collated_batches_are_identical(pair):
    base, _plain, _grouped = pair
    kw = {"batch_size": 8, "seed": 2}
    a = list(create_loader(str(base / "grouped"), "train", **kw))
    b = list(create_loader(str(base / "plain"), "train", **kw))
    assert len(a) == len(b) == N // 8
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if hasattr(x[k], "dtype"):
                assert x[k].dtype == y[k].dtype
                np.testing.assert_array_equal(x[k], y[k])
            else:
                assert x[k] == y[k]


def test_other_readers_see_the_grouped_member(pair):
    wds = pytest.importorskip("webdataset")
    base, _plain, grouped = pair
    shard = base / "grouped" / grouped.splits["train"].shards[0].path
    out = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True)
    assert out.stdout.split()[:4] == [
        "r0000.emb.npy",
        "r0000.fields.json",
        "r0000.long.txt",
        "r0000.meta.json",
    ]
    first = next(iter(wds.WebDataset([str(shard)], shardshuffle=False).decode()))
    assert first["fields.json"] == {
        "id": 0,
        "label": 0,
        "ok": True,
        "question": rows(1)[0]["question"],
        "score": 0.0,
    }


def test_a_missing_grouped_entry_names_sample_and_field(tmp_path):
    root = tmp_path / "ds"
    build_shards(rows(4), root, group_small_fields=True)
    manifest = Manifest.load(str(root))
    manifest.schema["extra"] = manifest.schema["id"]
    manifest.save(str(root))
    with pytest.raises(DecodeError, match=r"sample 'r0000', field 'extra'.*no entry 'extra'"):
        samples(root, gather=False)


def test_one_small_field_is_not_grouped_and_a_clash_is_refused(tmp_path):
    one = build_shards([{"x": np.zeros(2), "y": i} for i in range(3)], tmp_path / "one",
                       group_small_fields=True)  # fmt: skip
    assert not any(s.grouped for s in one.schema.values())
    with pytest.raises(ValueError, match="field 'fields' would clash"):
        build_shards([{"fields": 1, "y": 2}], tmp_path / "clash", group_small_fields=True)


def jsonl_rows(n: int) -> list[dict]:
    return [
        {
            "id": i,
            "question": f"what is the {i % 1013}th prime number after {i * 7 % 9973}?",
            "label": i % 10,
            "score": round((i * 37 % 1000) / 1000, 3),
        }
        for i in range(n)
    ]


def shard_bytes(manifest: Manifest) -> int:
    return sum(s.num_bytes for split in manifest.splits.values() for s in split.shards)


def test_small_records_reach_2x_the_jsonl_with_grouping_and_gzip(tmp_path, caplog):
    data = jsonl_rows(2000)
    source = sum(len(json.dumps(r)) + 1 for r in data)
    with caplog.at_level(logging.INFO, logger="build_shards"):
        plain = build_shards(data, tmp_path / "plain")
    hints = [r.getMessage() for r in caplog.records if "group_small_fields=True" in r.getMessage()]
    assert len(hints) == 1 and "compression='gzip'" in hints[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="build_shards"):
        both = build_shards(data, tmp_path / "both", group_small_fields=True, compression="gzip")
    assert not [r for r in caplog.records if "group_small_fields" in r.getMessage()]
    assert shard_bytes(plain) / source > 30
    assert shard_bytes(both) / source <= 2.0
    got = samples(tmp_path / "both")
    assert [{k: s[k] for k in data[0]} for s in got] == data


def test_cli_flags(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in jsonl_rows(30)))
    out = tmp_path / "ds"
    code = main(["build", str(src), "-o", str(out), "--group-small-fields", "--compression", "gzip",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    manifest = Manifest.load(str(out))
    assert {s.compression for s in manifest.splits["train"].shards} == {"gzip"}
    assert all(spec.grouped for spec in manifest.schema.values())
    assert manifest.splits["train"].shards[0].path.endswith(".tar.gz")
