"""The build's schema inferred from the first samples (not only the first): ints widened to
floats, fields absent or None in some samples optional (no member; the loader yields None),
and a later sample that does not fit fails naming its key, the field and how to declare it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from build_shards import build_shards
from build_shards.probe import infer
from tests.test_build_core import read_dataset
from wdsloader import create_loader, validate_batch
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, Manifest


def as_list(samples: list[dict]) -> list[dict]:
    return samples


def loaded(root, **kw) -> dict[str, dict]:
    """Every sample of ``train`` by key, read by the loader one sample at a time."""
    loader = create_loader(
        str(root), "train", batch_size=4, shuffle=False, drop_last=False, collate_fn=as_list, **kw
    )
    return {s["__key__"]: s for batch in loader for s in batch}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_an_int_then_a_float_widens_to_float(tmp_path):
    src = write_jsonl(tmp_path / "v.jsonl", [{"v": 1}, {"v": 1.5}, {"v": 2}])
    m = build_shards(src, tmp_path / "ds")
    assert m.schema["v"] == FieldSpec(ext="v.json", encoding="json", dtype="float64")
    _, data = read_dataset(tmp_path / "ds")
    assert [s["v.json"] for _, s in sorted(data["train"].items())] == [b"1.0", b"1.5", b"2.0"]
    got = loaded(tmp_path / "ds")
    assert [type(s["v"]) for s in got.values()] == [float] * 3
    assert [s["v"] for _, s in sorted(got.items())] == [1.0, 1.5, 2.0]
    batch = next(iter(create_loader(str(tmp_path / "ds"), "train", batch_size=3, shuffle=False)))
    assert batch["v"].dtype.is_floating_point and batch["v"].tolist() == [1.0, 1.5, 2.0]


@pytest.mark.parametrize("group", [False, True])
def test_a_key_absent_or_null_in_some_rows_is_optional(tmp_path, group):
    rows = [
        {"__key__": "a", "t": "x", "label": 1, "score": 0.5},
        {"__key__": "b", "t": "y", "label": 2},
        {"__key__": "c", "t": "z", "label": None, "score": 0.25},
        {"__key__": "d", "t": "w", "label": 3, "score": None},
    ]
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    m = build_shards(src, tmp_path / "ds", group_small_fields=group)
    assert m.schema["label"].optional and m.schema["label"].encoding == "cls"
    assert m.schema["score"].optional and m.schema["score"].dtype == "float64"
    assert not m.schema["t"].optional
    doc = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert doc["version"] == "2.1" and doc["schema"]["label"]["optional"] is True
    _, data = read_dataset(tmp_path / "ds")
    if not group:  # the WebDataset convention: no member for a field the sample lacks
        assert sorted(data["train"]["b"]) == ["label.cls", "t.txt"]
        assert sorted(data["train"]["c"]) == ["score.json", "t.txt"]
        assert data["train"]["d"]["score.json"] == b"null"  # None in a JSON field: null
    else:
        assert json.loads(data["train"]["b"]["fields.json"]) == {"label": 2, "t": "y"}
    got = loaded(tmp_path / "ds")
    assert {k: (s["label"], s["score"]) for k, s in got.items()} == {
        "a": (1, 0.5),
        "b": (2, None),
        "c": (None, 0.25),
        "d": (3, None),
    }
    # the default collator: a list where a value is None; such a batch passes validation
    loader = create_loader(str(tmp_path / "ds"), "train", batch_size=4, shuffle=False)
    batch = next(iter(loader))
    assert batch["score"] == [0.5, None, 0.25, None] and batch["label"] == [1, 2, None, 3]
    validate_batch(batch, loader.output_schema())


def test_optional_fields_beside_gathered_arrays_read_the_same_on_every_path(tmp_path):
    rows = []
    for i in range(40):
        row = {"__key__": f"k{i:03d}", "emb": np.full(4, i, np.float32), "i": i}
        if i % 3:
            row["note"] = f"n{i}"
        if 10 <= i < 20:
            row["extra"] = np.arange(i % 5 + 1, dtype=np.int64)  # varying shape, in 10 rows
        rows.append(row)
    m = build_shards(rows, tmp_path / "ds", shard_max_count=16)
    assert m.schema["emb"].fixed_size and not m.schema["emb"].optional
    assert m.schema["note"].optional and m.schema["extra"].optional
    assert m.schema["extra"].shape is None and m.schema["extra"].dtype == "int64"
    for gather in (True, False):
        got = loaded(tmp_path / "ds", gather=gather)
        assert sorted(got) == [r["__key__"] for r in rows]
        for r in rows:
            s = got[r["__key__"]]
            assert s["emb"].tolist() == r["emb"].tolist() and s["i"] == r["i"]
            assert s["note"] == r.get("note")
            extra = r.get("extra")
            assert (s["extra"] is None) if extra is None else s["extra"].tolist() == extra.tolist()


def test_a_batch_whose_samples_all_lack_an_optional_field_keeps_the_batch_path(tmp_path):
    rows = [
        {"__key__": f"k{i:02d}", "emb": np.full(2, i, np.float32), "t": f"t{i}"} for i in range(12)
    ]
    for r in rows[8:]:
        r["extra"] = {"i": r["__key__"]}
    build_shards(rows, tmp_path / "ds")
    for gather in (True, False):
        got = loaded(tmp_path / "ds", gather=gather)  # batches of 4: two lack "extra" entirely
        assert [s["extra"] for _, s in sorted(got.items())] == [None] * 8 + [
            {"i": f"k{i:02d}"} for i in range(8, 12)
        ]
        assert [s["t"] for _, s in sorted(got.items())] == [f"t{i}" for i in range(12)]


def test_conflicting_types_in_the_inferred_rows_name_both_samples(tmp_path):
    rows = [{"__key__": "a", "v": 1}, {"__key__": "b", "v": "one"}]
    with pytest.raises(SchemaError) as err:
        build_shards(rows, tmp_path / "ds")
    assert str(err.value).startswith(
        "sample 'b': field 'v': a str (.txt) here but an int (.cls) in sample 'a' (the schema was "
        "inferred from the first samples, up to 1,000; declare the field: "
        "build_shards(schema={'v': {'encoding': 'json'}}), or build-shards build --schema FILE "
    )
    m = build_shards(rows, tmp_path / "ds", schema={"v": {"encoding": "json"}})
    assert m.schema["v"] == FieldSpec(ext="v.json", encoding="json", dtype="json")


@pytest.mark.parametrize(
    ("late", "message"),
    [
        ({"v": 1.5}, "field 'v': expected an int (.cls), got float 1.5 (the schema was inferred"),
        ({}, r"fields differ from the schema: missing ['v'], unexpected [] (the schema was"),
        ({"v": 1, "w": 2}, r"missing [], unexpected ['w'] (the schema was inferred"),
    ],
)
def test_a_later_row_that_does_not_fit_names_key_field_and_how_to_declare(
    tmp_path, monkeypatch, late, message
):
    monkeypatch.setattr(infer, "INFER_ROWS", 3)
    rows = [{"__key__": f"k{i}", "v": i} for i in range(5)]
    rows.append({"__key__": "late", **late})
    with pytest.raises(SchemaError) as err:
        build_shards(rows, tmp_path / "ds")
    text = str(err.value)
    assert text.startswith("sample 'late': ") and message in text
    assert "build_shards(schema={" in text and "build-shards build --schema FILE" in text
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_a_declared_optional_field_no_inferred_row_has(tmp_path, monkeypatch):
    monkeypatch.setattr(infer, "INFER_ROWS", 2)
    rows = [{"__key__": f"k{i}", "v": i} for i in range(4)]
    rows[3]["w"] = "late"
    with pytest.raises(SchemaError, match=r"unexpected \['w'\]"):
        build_shards(rows, tmp_path / "a")
    schema = {"w": {"encoding": "txt", "optional": True}}
    m = build_shards(rows, tmp_path / "b", schema=schema)
    assert m.schema["w"] == FieldSpec(ext="w.txt", encoding="txt", dtype="str", optional=True)
    assert {k: s["w"] for k, s in loaded(tmp_path / "b").items()} == {
        "k0": None,
        "k1": None,
        "k2": None,
        "k3": "late",
    }
    with pytest.raises(SchemaError, match="declared field 'x' is missing from the first samples"):
        build_shards(rows, tmp_path / "c", schema={"x": {"encoding": "txt"}})


def test_inference_is_the_same_for_any_number_of_workers(tmp_path):
    rows = [{"__key__": f"k{i:04d}", "v": i if i % 7 else i + 0.5, "o": i} for i in range(300)]
    for r in rows[::5]:
        del r["o"]
    a = build_shards(rows, tmp_path / "one", shard_max_count=20, block_size=40)
    b = build_shards(rows, tmp_path / "two", shard_max_count=20, block_size=40, workers=2)
    assert a.schema == b.schema and a.schema["o"].optional
    for split in a.splits:
        for sa, sb in zip(a.splits[split].shards, b.splits[split].shards, strict=True):
            assert (sa.path, sa.sha256) == (sb.path, sb.sha256)
    assert Manifest.load(tmp_path / "two").schema == a.schema


@pytest.mark.parametrize("gather", [True, False])
def test_an_optional_field_is_a_list_in_every_batch_of_the_default_collator(tmp_path, gather):
    rows = [{"__key__": f"k{i:02d}", "x": i, "score": i / 4} for i in range(12)]
    for r in rows[9:]:
        del r["score"]  # only the last batch of 4 (k08..k11) lacks some values
    m = build_shards(rows, tmp_path / "ds")
    assert m.schema["score"].optional and not m.schema["x"].optional
    loader = create_loader(
        str(tmp_path / "ds"), "train", batch_size=4, shuffle=False, gather=gather
    )
    batches = list(loader)
    assert [type(b["score"]) for b in batches] == [list] * len(batches)  # never a tensor
    assert all(isinstance(b["x"], torch.Tensor) for b in batches)
    keys = [k for b in batches for k in b["__key__"]]
    scores = [s for b in batches for s in b["score"]]
    assert dict(zip(keys, scores, strict=True)) == {r["__key__"]: r.get("score") for r in rows}


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([np.int32(1), 2**40], "int"),
        ([np.uint8(1), 300], "int"),
        ([np.int32(1), np.int64(2**40)], "int64"),
        ([np.uint8(1), np.uint16(300)], "uint16"),
        ([np.int8(-1), np.int16(-300)], "int16"),
    ],
)
def test_ints_of_several_dtypes_in_the_inferred_rows_widen(tmp_path, values, dtype):
    """The first row's numpy int dtype no longer bounds the field: a later inferred row's int
    (2**40 after an np.int32) was refused as not fitting int32."""
    rows = [{"__key__": f"k{i}", "v": v} for i, v in enumerate(values)]
    m = build_shards(rows, tmp_path / "ds")
    assert m.schema["v"].encoding == "cls" and m.schema["v"].dtype == dtype
    got = loaded(tmp_path / "ds")
    assert [got[f"k{i}"]["v"] for i in range(len(values))] == [int(v) for v in values]


def test_arrays_of_two_dtypes_in_the_inferred_rows_name_both_dtypes(tmp_path):
    """Was 'a ndarray (.npy) here but a ndarray (.npy)', with a hint to store them as JSON; a
    later row of another dtype was told to declare its dtype, which refuses the first rows."""
    rows = [
        {"__key__": "a", "v": np.zeros(3, np.float32)},
        {"__key__": "b", "v": np.zeros(3, np.float64)},
    ]
    with pytest.raises(SchemaError) as err:
        build_shards(rows, tmp_path / "ds")
    assert str(err.value).startswith(
        "sample 'b': field 'v': a ndarray of float64 (.npy) here but a ndarray of float32 (.npy) "
        "in sample 'a' (the schema was inferred from the first samples, up to 1,000; declare the "
        "field: build_shards(schema={'v': {'dtype': None}}), or build-shards build --schema FILE "
        'with {"v": {"dtype": null}}'
    )
    m = build_shards(rows, tmp_path / "ds", schema={"v": {"dtype": None}})
    assert m.schema["v"].dtype is None
    got = loaded(tmp_path / "ds")
    assert [got[k]["v"].dtype for k in "ab"] == [np.float32, np.float64]


def test_a_later_array_of_another_dtype_is_told_to_declare_any_dtype(tmp_path, monkeypatch):
    """Declaring the later row's dtype (the hint before) refuses every earlier row."""
    monkeypatch.setattr(infer, "INFER_ROWS", 2)
    rows = [{"__key__": f"k{i}", "v": np.zeros(3, np.float32)} for i in range(3)]
    rows.append({"__key__": "late", "v": np.zeros(3, np.float64)})
    with pytest.raises(SchemaError) as err:
        build_shards(rows, tmp_path / "ds")
    assert str(err.value).startswith(
        "sample 'late': field 'v': dtype float64 differs from the schema's float32 (the schema "
    )
    assert "build_shards(schema={'v': {'dtype': None}})" in str(err.value)
    assert build_shards(rows, tmp_path / "ds", schema={"v": {"dtype": None}}).num_samples == 4


@pytest.mark.parametrize("gather", [True, False])
def test_an_optional_field_is_a_list_in_every_batch_of_the_vision_collator(tmp_path, gather):
    """The vision (and text) collators passed their other fields through a plain
    DefaultCollator: an optional field was a tensor in a batch that had it in every sample."""
    rows = [
        {"__key__": f"k{i:02d}", "image": np.full((4, 4, 3), i, np.uint8), "label": i % 3}
        for i in range(12)
    ]
    for i, r in enumerate(rows[:9]):
        r["score"] = i / 4  # only the last batch of 4 (k08..k11) lacks some values
    m = build_shards(rows, tmp_path / "ds")
    assert m.schema["score"].optional
    loader = create_loader(
        str(tmp_path / "ds"), "train", batch_size=4, shuffle=False, gather=gather,
        collate_fn="vision", collate_options={"image_field": "image", "label_field": "label"},
    )  # fmt: skip
    batches = list(loader)
    assert [type(b["score"]) for b in batches] == [list] * 3  # never a tensor
    assert all(b["pixel_values"].shape == (4, 3, 4, 4) for b in batches)
    keys = [k for b in batches for k in b["__key__"]]
    scores = [s for b in batches for s in b["score"]]
    assert dict(zip(keys, scores, strict=True)) == {r["__key__"]: r.get("score") for r in rows}


@pytest.mark.parametrize("gather", [True, False])
def test_an_optional_scalar_reads_as_the_same_type_as_a_required_one(tmp_path, gather):
    """Per sample, an optional field's value has the type the same field has when required:
    a ``.cls`` int the schema dtype's numpy scalar (``int`` -> np.int64, int32 -> np.int32), a
    ``.json`` float a Python float, in a batch where every sample has it and in one where not."""
    rows = [
        {"__key__": f"k{i:02d}", "i": i, "f": i / 2, "n": np.int32(i), "oi": i, "of": i / 2}
        for i in range(8)
    ]
    for r in rows:
        r["on"] = r["n"]
    for r in rows[6:]:
        del r["oi"], r["of"], r["on"]  # batches of 4: the second lacks them in two samples
    build_shards(rows, tmp_path / "ds")
    got = loaded(tmp_path / "ds", gather=gather)
    for key in ("k00", "k04"):
        s = got[key]
        assert [type(s[f]) for f in ("i", "f", "n")] == [np.int64, float, np.int32]
        assert [type(s[f]) for f in ("oi", "of", "on")] == [np.int64, float, np.int32]
    assert [got["k07"][f] for f in ("oi", "of", "on")] == [None, None, None]
