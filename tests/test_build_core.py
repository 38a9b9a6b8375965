"""build_shards: sources, keys, encoding and member order, schema checks, splits, shard bounds."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from build_shards import BuildError, OutputExistsError, build_shards
from build_shards.encode.sample import SampleEncoder
from build_shards.probe import infer
from build_shards.probe.infer import infer_schema
from wdsloader.errors import SchemaError
from wdsloader.format import (
    BLOCK,
    FieldSpec,
    Manifest,
    decode_index,
    iter_samples,
    scan_tar,
)
from wdsloader.io.storage import join, url_to_fs

# ------------------------------------------------------------------------------------------------
# helpers (also used by the other test_build_* modules)
# ------------------------------------------------------------------------------------------------


def read_dataset(
    root: str | os.PathLike[str], storage_options: dict | None = None
) -> tuple[Manifest, dict[str, dict[str, dict[str, bytes]]]]:
    """The manifest and every sample's raw members: {split: {key: {ext: bytes}}}, checking that
    each shard's idx, size and sample count agree with its bytes."""
    manifest = Manifest.load(root, storage_options)
    fs, base = url_to_fs(root, storage_options)
    out: dict[str, dict[str, dict[str, bytes]]] = {}
    for split, info in manifest.splits.items():
        samples: dict[str, dict[str, bytes]] = {}
        for shard in info.shards:
            data = fs.cat_file(join(base, shard.path))
            assert len(data) == shard.num_bytes
            offsets, keys = scan_tar(data)
            idx = decode_index(fs.cat_file(join(base, shard.idx_path)))
            assert idx.tolist() == offsets.tolist()
            assert len(keys) == shard.num_samples
            for key, _start, fields in iter_samples(data):
                assert key not in samples
                samples[key] = {ext: bytes(data[o : o + n]) for ext, (o, n) in fields.items()}
        out[split] = samples
    return manifest, out


def npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def gen_samples(n: int, start: int = 0):
    """A deterministic generator of small samples."""
    for i in range(start, start + n):
        yield {"__key__": f"s{i:06d}", "vec": np.full(3, i, np.float32), "i": i}


# ------------------------------------------------------------------------------------------------
# encoding and member order
# ------------------------------------------------------------------------------------------------


def test_every_type_is_encoded_without_pickle_and_fixed_fields_come_first(tmp_path):
    torch = pytest.importorskip("torch")
    from PIL import Image

    def sample(i: int) -> dict:
        img = Image.new("RGB", (4, 3), (i, 2 * i, 3))
        return {
            "zz_emb": np.arange(6, dtype=np.float64).reshape(2, 3) + i,
            "a_tensor": torch.full((2,), float(i)),
            "tokens": np.arange(i + 1, dtype=np.int32),  # varying shape: declared below
            "caption": f"caption {i} é",
            "label": i,
            "np_label": np.int16(i),
            "score": i / 4,
            "flag": i % 2 == 0,
            "tags": ["x", i],
            "meta": {"i": i, "nested": {"k": [1.5]}},
            "nothing": None,
            "blob.bin": bytes([i, 255]),
            "img": img,
            "photo.jpg": img,
        }

    items = [sample(i) for i in range(5)]
    m = build_shards(items, tmp_path / "ds", schema={"tokens": {"shape": None}})
    enc = {f: s.encoding for f, s in m.schema.items()}
    assert enc == {
        "a_tensor": "npy",
        "zz_emb": "npy",
        "blob": "bin",
        "caption": "txt",
        "flag": "json",
        "img": "png",
        "label": "cls",
        "meta": "json",
        "np_label": "cls",
        "nothing": "json",
        "photo": "jpg",
        "score": "json",
        "tags": "json",
        "tokens": "npy",
    }
    assert m.schema["zz_emb"].dtype == "float64" and m.schema["zz_emb"].shape == [2, 3]
    assert m.schema["np_label"].dtype == "int16"
    _, data = read_dataset(tmp_path / "ds")
    shard = m.splits["train"].shards[0]
    raw = (tmp_path / "ds" / shard.path).read_bytes()
    # members in the same order in every sample: fixed-size (npy with a fixed shape) first
    names = [list(fields) for _k, _s, fields in iter_samples(raw)]
    expected = ["a_tensor.npy", "zz_emb.npy", "blob.bin", "caption.txt", "flag.json", "img.png"]
    expected += ["label.cls", "meta.json", "nothing.json", "np_label.cls", "photo.jpg"]
    expected += ["score.json", "tags.json", "tokens.npy"]
    assert all(n == expected for n in names)
    # ... so the fixed fields sit at constant offsets, which the shard layout records
    assert shard.layout["a_tensor.npy"][0] == BLOCK
    assert "zz_emb.npy" in shard.layout and "tokens.npy" not in shard.layout
    for i in range(5):
        s = data["train"][f"{i:09d}"]
        np.testing.assert_array_equal(npy(s["zz_emb.npy"]), items[i]["zz_emb"])
        assert npy(s["a_tensor.npy"]).dtype == np.float32
        np.testing.assert_array_equal(npy(s["tokens.npy"]), np.arange(i + 1, dtype=np.int32))
        assert s["caption.txt"].decode() == f"caption {i} é"
        assert int(s["label.cls"]) == i and int(s["np_label.cls"]) == i
        assert json.loads(s["score.json"]) == i / 4
        assert json.loads(s["flag.json"]) is (i % 2 == 0)
        assert json.loads(s["tags.json"]) == ["x", i]
        assert json.loads(s["meta.json"]) == {"i": i, "nested": {"k": [1.5]}}
        assert json.loads(s["nothing.json"]) is None
        assert s["blob.bin"] == bytes([i, 255])
        assert Image.open(io.BytesIO(s["img.png"])).getpixel((0, 0)) == (i, 2 * i, 3)
        assert Image.open(io.BytesIO(s["photo.jpg"])).format == "JPEG"


def test_npy_bytes_equal_numpy_save_for_any_memory_layout():
    arrays = [
        np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        np.arange(12, dtype=">i4").reshape(3, 4),
        np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],
        np.array(3.5, dtype=np.float32),
    ]
    for arr in arrays:
        schema, dims = infer_schema([("k", {"a": arr})])
        enc = SampleEncoder(schema, dims)
        for _ in range(2):  # second call uses the cached header
            ((_, data),) = enc.encode("k", {"a": arr})[0]
            buf = io.BytesIO()
            np.save(buf, arr.astype(arr.dtype.newbyteorder("<"), order="C"))
            assert data == buf.getvalue()
            assert npy(data).shape == arr.shape  # a 0-d array stays 0-d
            np.testing.assert_array_equal(npy(data), arr)


@pytest.mark.parametrize(
    ("value", "name", "fragment"),
    [
        (b"raw", "blob", "explicit extension"),
        (np.array([{"a": 1}], dtype=object), "obj", "pickle"),
        (object(), "thing", "cannot be stored without pickle"),
        (np.zeros(2), "arr.json", "cannot be stored as .json"),
    ],
)
def test_unstorable_values_are_refused_naming_key_and_field(tmp_path, value, name, fragment):
    with pytest.raises(SchemaError, match=fragment) as err:
        build_shards([{"__key__": "k0", name: value}], tmp_path / "ds")
    assert "'k0'" in str(err.value) and f"'{name.split('.')[0]}'" in str(err.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()


# ------------------------------------------------------------------------------------------------
# sources
# ------------------------------------------------------------------------------------------------


def _expected_ints(data, n):
    return sorted(int(s["i.cls"]) for s in data["train"].values()) == list(range(n))


def test_list_tuple_and_generator_sources_and_key_field(tmp_path):
    items = list(gen_samples(7))
    for i, source in enumerate([items, tuple(items), gen_samples(7), iter(items)]):
        build_shards(source, tmp_path / f"d{i}", shard_max_count=3)
        _, data = read_dataset(tmp_path / f"d{i}")
        assert sorted(data["train"]) == [f"s{i:06d}" for i in range(7)]
        assert _expected_ints(data, 7)


def test_torch_map_style_and_iterable_sources(tmp_path):
    torch = pytest.importorskip("torch")

    class MapStyle(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"x": torch.tensor([i, i + 1], dtype=torch.int64), "i": i}

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return ({"x": torch.tensor([i, i + 1]), "i": i} for i in range(6))

    for name, src in (("map", MapStyle()), ("iter", Stream())):
        m = build_shards(src, tmp_path / name, shard_max_count=4)
        assert m.schema["x"].dtype == "int64" and m.splits["train"].num_samples == 6
        _, data = read_dataset(tmp_path / name)
        assert _expected_ints(data, 6)
        np.testing.assert_array_equal(npy(data["train"]["000000005"]["x.npy"]), [5, 6])


def test_hf_dataset_keeps_dtypes_and_datasetdict_keeps_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features(
        {
            "emb": datasets.List(datasets.Value("float64")),
            "grid": datasets.List(datasets.List(datasets.Value("float16"))),
            "ragged": datasets.List(datasets.Value("int32")),
            "text": datasets.Value("string"),
            "label": datasets.Value("int64"),
        }
    )

    def rows(n, off):
        return {
            "emb": [[0.1 + i, 1e-300] for i in range(off, off + n)],
            "grid": [[[i, 0.5], [1.0, 2.0]] for i in range(off, off + n)],
            "ragged": [list(range(i % 3 + 1)) for i in range(off, off + n)],
            "text": [f"t{i}" for i in range(off, off + n)],
            "label": list(range(off, off + n)),
        }

    ds = datasets.Dataset.from_dict(rows(5, 0), features=feats)
    m = build_shards(ds, tmp_path / "hf", schema={"ragged": {"shape": None}})
    assert m.schema["emb"].dtype == "float64" and m.schema["grid"].dtype == "float16"
    assert m.schema["grid"].shape == [2, 2] and m.schema["label"].encoding == "cls"
    _, data = read_dataset(tmp_path / "hf")
    s = data["train"]["000000003"]
    np.testing.assert_array_equal(npy(s["emb.npy"]), [3.1, 1e-300])  # float64 kept exactly
    np.testing.assert_array_equal(npy(s["ragged.npy"]), np.arange(1, dtype=np.int32))
    assert s["text.txt"] == b"t3" and s["label.cls"] == b"3"

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows(6, 0), features=feats),
            "test": datasets.Dataset.from_dict(rows(3, 6), features=feats),
        }
    )
    m = build_shards(dd, tmp_path / "dd", schema={"ragged": {"shape": None}}, block_size=4)
    assert list(m.splits) == ["train", "test"]
    assert [m.splits[s].num_samples for s in m.splits] == [6, 3]
    _, data = read_dataset(tmp_path / "dd")
    assert sorted(int(s["label.cls"]) for s in data["test"].values()) == [6, 7, 8]
    with pytest.raises(BuildError, match="one way"):
        build_shards(dd, tmp_path / "dd2", splits={"a": 0.5, "b": 0.5})

    it = datasets.Dataset.from_dict(rows(4, 0), features=feats).to_iterable_dataset()
    m = build_shards(it, tmp_path / "hfit", schema={"ragged": {"shape": None}})
    assert m.schema["emb"].dtype == "float64" and m.splits["train"].num_samples == 4


def test_jsonl_files_path_glob_list_and_bad_line_named(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_text('{"t": "a0", "n": 0}\n\n{"t": "a1", "n": 1}\n')
    (d / "b.jsonl").write_text('{"t": "b0", "n": 2}\n')
    for i, src in enumerate(
        [str(d / "a.jsonl"), str(d / "*.jsonl"), [d / "a.jsonl", d / "b.jsonl"]]
    ):
        m = build_shards(src, tmp_path / f"j{i}")
        _, data = read_dataset(tmp_path / f"j{i}")
        texts = sorted(s["t.txt"].decode() for s in data["train"].values())
        assert texts == (["a0", "a1"] if i == 0 else ["a0", "a1", "b0"])
        assert m.schema["n"].encoding == "cls"
    (d / "c.jsonl").write_text('{"t": "c0", "n": 3}\n{"t": oops}\n')
    with pytest.raises(BuildError, match=r"c\.jsonl:2: not a valid JSON line"):
        build_shards(d / "c.jsonl", tmp_path / "bad")
    assert not (tmp_path / "bad" / "manifest.json").exists()
    assert not list((tmp_path / "bad").rglob("*.tar"))
    with pytest.raises(BuildError, match="input not found"):
        build_shards(d / "missing.jsonl", tmp_path / "x")
    with pytest.raises(BuildError, match="no input file matches"):
        build_shards(str(d / "*.nope.jsonl"), tmp_path / "x")


def test_text_files_split_documents_on_blank_lines(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\n\nsecond\n  \nthird\n")
    m = build_shards(tmp_path / "a.txt", tmp_path / "ds")
    _, data = read_dataset(tmp_path / "ds")
    docs = [data["train"][k]["text.txt"].decode() for k in sorted(data["train"])]
    assert docs == ["first doc\nline two", "second", "third"]
    assert m.schema["text"].encoding == "txt"


def test_unknown_source_type_and_empty_sources(tmp_path):
    with pytest.raises(TypeError, match="builtins.set"):
        build_shards({1, 2}, tmp_path / "a")
    for empty in ([], iter([])):
        with pytest.raises(BuildError, match="source is empty"):
            build_shards(empty, tmp_path / "b")
    with pytest.raises(BuildError, match="dropped all 3"):
        build_shards(iter(list(gen_samples(3))), tmp_path / "c", map=lambda s: None)
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


# ------------------------------------------------------------------------------------------------
# keys and map
# ------------------------------------------------------------------------------------------------


def test_duplicate_keys_are_refused_within_and_across_blocks(tmp_path):
    for block_size, dup_at in ((100, 5), (4, 9)):
        items = list(gen_samples(12))
        items[dup_at]["__key__"] = "s000001"
        out = tmp_path / f"b{block_size}"
        with pytest.raises(BuildError, match="duplicate key 's000001'"):
            build_shards(items, out, block_size=block_size)
        assert not (out / "manifest.json").exists() and not list(out.rglob("*.tar"))
    with pytest.raises(BuildError, match="invalid sample key 'a.b'"):
        build_shards([{"__key__": "a.b", "x": 1}], tmp_path / "k")


def test_map_sees_the_key_may_rename_it_and_drop_samples(tmp_path):
    def fn(s):
        if s["i"] % 3 == 0:
            return None
        return {"__key__": s["__key__"].upper(), "double": s["i"] * 2}

    m = build_shards(list(gen_samples(9)), tmp_path / "ds", map=fn)
    _, data = read_dataset(tmp_path / "ds")
    assert sorted(data["train"]) == [f"S{i:06d}" for i in range(9) if i % 3]
    assert data["train"]["S000004"]["double.cls"] == b"8"
    assert m.build["dropped_by_map"] == 3


# ------------------------------------------------------------------------------------------------
# schema checks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"vec": np.zeros(4, np.float32), "i": 1}, r"field 'vec': shape \[4\] differs"),
        ({"vec": np.zeros(3, np.float64), "i": 1}, "field 'vec': dtype float64 differs"),
        ({"vec": np.zeros(3, np.float32)}, r"missing \['i'\]"),
        ({"vec": np.zeros(3, np.float32), "i": 1, "extra": "x"}, r"unexpected \['extra'\]"),
        ({"vec": np.zeros(3, np.float32), "i": "one"}, r"field 'i': expected an int"),
        ({"vec": np.array([0, np.nan, 0], np.float32), "i": 1}, "field 'vec': NaN or Inf"),
    ],
)
def test_schema_mismatch_names_key_and_field(tmp_path, monkeypatch, bad, fragment):
    monkeypatch.setattr(infer, "INFER_ROWS", 2)  # the schema of the first 2: item 4 is checked
    items = list(gen_samples(6))
    items[4] = {"__key__": "bad_one", **bad}
    with pytest.raises(SchemaError, match=fragment) as err:
        build_shards(items, tmp_path / "ds", block_size=2)
    assert "sample 'bad_one'" in str(err.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert not list((tmp_path / "ds").rglob("*.tar*"))


def test_allow_nan_counts_samples_instead_of_failing(tmp_path, caplog):
    items = list(gen_samples(5))
    items[3]["score"] = float("nan")
    for it in items:
        it.setdefault("score", 0.5)
    with pytest.raises(SchemaError, match="sample 's000003': field 'score': NaN"):
        build_shards(items, tmp_path / "a")
    items[1]["vec"] = np.array([np.inf, 0, 0], np.float32)
    m = build_shards(items, tmp_path / "b", allow_nan=True)
    assert m.build["nan_samples"] == 2
    assert "2 samples hold NaN" in caplog.text
    assert Manifest.load(tmp_path / "b").build["nan_samples"] == 2


def test_declared_schema_symbolic_dims_and_ranges(tmp_path):
    items = [
        {"q": np.zeros(8, np.float32), "neg": np.ones((3, 8), np.float32), "p": 0.5}
        for _ in range(4)
    ]
    schema = {
        "q": FieldSpec(ext="q.npy", encoding="npy", dtype="float32", shape=["D"]),
        "neg": {"shape": ["N_neg", "D"], "range": [0, 1]},
        "p": {"range": [0, 1]},
    }
    m = build_shards(items, tmp_path / "ok", schema=schema, dims={"D": 8})
    assert m.dims == {"D": 8, "N_neg": 3}
    assert m.schema["neg"].shape == ["N_neg", "D"] and m.schema["neg"].range == [0, 1]
    with pytest.raises(
        SchemaError, match=r"'neg': shape \[3, 8\] differs .*\[N_neg, D\] = \[3, 16\]"
    ):
        build_shards(items, tmp_path / "d16", schema=schema, dims={"D": 16})
    items[2]["neg"] = np.full((3, 8), 2, np.float32)
    with pytest.raises(SchemaError, match="sample '000000002': field 'neg'.*outside the declared"):
        build_shards(items, tmp_path / "range", schema=schema, dims={"D": 8})
    items[2]["neg"] = np.ones((3, 8), np.float32)
    items[3]["p"] = 1.5
    with pytest.raises(SchemaError, match="sample '000000003': field 'p'.*outside"):
        build_shards(items, tmp_path / "range2", schema=schema, dims={"D": 8})


# ------------------------------------------------------------------------------------------------
# splits
# ------------------------------------------------------------------------------------------------


def _split_of_keys(root) -> dict[str, str]:
    _, data = read_dataset(root)
    return {k: split for split, samples in data.items() for k in samples}


def test_split_fractions_are_close_to_requested_on_10k_samples(tmp_path):
    items = [{"i": i} for i in range(10_000)]
    fracs = {"train": 0.8, "val": 0.1, "test": 0.1}
    m = build_shards(items, tmp_path / "ds", splits=fracs, seed=3, shard_max_count=5000)
    assert list(m.splits) == ["train", "val", "test"]
    for name, frac in fracs.items():
        # binomial sd for 10k draws is at most 0.004: 4 sd
        assert abs(m.splits[name].num_samples / 10_000 - frac) < 0.016
    assert m.num_samples == 10_000
    assert m.build["splits"]["fractions"] == fracs and m.build["seed"] == 3
    other = build_shards(items[:2000], tmp_path / "seed4", splits=fracs, seed=4)
    mine = _split_of_keys(tmp_path / "ds")
    theirs = _split_of_keys(tmp_path / "seed4")
    assert sum(mine[k] != theirs[k] for k in theirs) > 100  # the seed matters
    assert other.build["seed"] == 4


@pytest.mark.parametrize(
    "bad", [{"train": 0.8, "val": 0.1}, {"train": 1.2, "val": -0.2}, {"a": 1.0, "b": 0}, {}]
)
def test_bad_fractions_raise_value_error(tmp_path, bad):
    with pytest.raises(ValueError, match="fraction|sum to 1|non-empty"):
        build_shards([{"i": 1}], tmp_path / "ds", splits=bad)


def test_group_never_straddles_splits(tmp_path):
    items = [{"question": f"q{i // 5}", "i": i} for i in range(600)]
    build_shards(
        items,
        tmp_path / "ds",
        splits={"train": 0.5, "val": 0.5},
        group_by="question",
        block_size=64,
    )
    _, data = read_dataset(tmp_path / "ds")
    groups: dict[str, set[str]] = {}
    for split, samples in data.items():
        for s in samples.values():
            groups.setdefault(s["question.txt"].decode(), set()).add(split)
    assert len(groups) == 120
    assert all(len(v) == 1 for v in groups.values())
    assert {next(iter(v)) for v in groups.values()} == {"train", "val"}


def test_appending_samples_never_moves_existing_ones(tmp_path):
    fracs = {"train": 0.7, "val": 0.2, "test": 0.1}
    build_shards(list(gen_samples(500)), tmp_path / "a", splits=fracs, block_size=128)
    build_shards(
        list(gen_samples(800)), tmp_path / "b", splits=fracs, block_size=300, shard_max_count=50
    )
    before, after = _split_of_keys(tmp_path / "a"), _split_of_keys(tmp_path / "b")
    assert len(before) == 500 and len(after) == 800
    assert all(after[k] == v for k, v in before.items())


def test_split_field_names_the_split_and_is_not_stored(tmp_path):
    items = [{"i": i, "split": ["train", "dev", "eval"][i % 3]} for i in range(9)]
    m = build_shards(items, tmp_path / "ds", split_field="split")
    assert list(m.splits) == ["train", "dev", "eval"]
    assert "split" not in m.schema
    _, data = read_dataset(tmp_path / "ds")
    assert sorted(int(s["i.cls"]) for s in data["dev"].values()) == [1, 4, 7]
    assert all(list(s) == ["i.cls"] for s in data["eval"].values())
    with pytest.raises(SchemaError, match="invalid split name '../x'"):
        build_shards([{"i": 1, "split": "../x"}], tmp_path / "bad", split_field="split")


# ------------------------------------------------------------------------------------------------
# shard bounds, output handling
# ------------------------------------------------------------------------------------------------


def test_shards_respect_count_and_real_byte_bounds(tmp_path, caplog):
    rng = np.random.default_rng(0)
    items = [{"blob.bin": bytes(int(n))} for n in rng.integers(10, 3000, size=80)]
    items[40] = {"blob.bin": bytes(20_000)}  # alone over the limit
    limit = 8192
    m = build_shards(items, tmp_path / "ds", shard_max_bytes=limit, shard_max_count=6)
    sizes = []
    for shard in m.splits["train"].shards:
        path = tmp_path / "ds" / shard.path
        assert path.stat().st_size == shard.num_bytes
        assert shard.num_samples <= 6
        if shard.num_bytes > limit:
            assert shard.num_samples == 1  # only the oversized sample gets a larger shard
        sizes.append(shard.num_bytes)
    assert sum(s > limit for s in sizes) == 1
    assert max(s for s in sizes if s <= limit) > limit - 3584  # shards are filled, not tiny
    assert "alone makes a" in caplog.text
    assert m.num_samples == 80
    m2 = build_shards(items, tmp_path / "count", shard_max_count=7, block_size=30)
    counts = [s.num_samples for s in m2.splits["train"].shards]
    # blocks of 30: 7+7+7+7+2, 7+7+7+7+2, 7+7+6; their last shards (2, 2, 6) are packed into
    # 7 + 3, each named after the block part its first sample comes from
    assert counts == [7] * 11 + [3]
    assert [Path(s.path).name for s in m2.splits["train"].shards][4:6] == [
        "train-00000-004.tar",
        "train-00001-000.tar",
    ]
    assert Path(m2.splits["train"].shards[-1].path).name == "train-00002-002.tar"


def test_existing_dataset_needs_overwrite_which_replaces_it(tmp_path):
    out = tmp_path / "ds"
    build_shards(list(gen_samples(10)), out, shard_max_count=2, splits={"a": 0.5, "b": 0.5})
    old = set(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(OutputExistsError, match="already holds a complete dataset"):
        build_shards(list(gen_samples(3)), out)
    with pytest.raises(FileExistsError):
        build_shards(list(gen_samples(3)), out)
    assert set(p.relative_to(out) for p in out.rglob("*")) == old
    m = build_shards(list(gen_samples(3)), out, overwrite=True)
    assert list(m.splits) == ["train"] and m.num_samples == 3
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    # written beside the old shards under the other prefix; the old ones went after the switch
    assert files == [
        "README.md",
        "manifest.json",
        "train/.train-r-00000-000.tar.wdsidx",
        "train/.train-r-00000-000.tar.wdskeys",
        "train/train-r-00000-000.tar",
    ]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "manifest.json", "train"]
    build_shards(list(gen_samples(4)), out, overwrite=True)  # and back
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "manifest.json",
        "train/.train-00000-000.tar.wdsidx",
        "train/.train-00000-000.tar.wdskeys",
        "train/train-00000-000.tar",
    ]


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _failing_stream(n: int, start: int, at: int):
    for i, sample in enumerate(gen_samples(n, start)):
        if i == at:
            raise OSError(f"input went away at item {i}")
        yield sample


def test_a_failed_overwrite_leaves_the_old_dataset_whole_and_a_good_one_replaces_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(infer, "INFER_ROWS", 10)  # the source fails after the inferred samples
    out = tmp_path / "ds"
    opts = dict(shard_max_count=10, block_size=20, splits={"a": 0.5, "b": 0.5})
    build_shards(list(gen_samples(120)), out, **opts)
    old = _files(out)
    old_keys = {k for split in read_dataset(out)[1].values() for k in split}
    assert len(old_keys) == 120

    def old_dataset_intact() -> None:
        manifest, data = read_dataset(out)  # sizes, idx and sample counts checked
        assert {k for split in data.values() for k in split} == old_keys
        for split in manifest.splits.values():
            for shard in split.shards:
                assert hashlib.sha256((out / shard.path).read_bytes()).hexdigest() == shard.sha256
        assert {p: b for p, b in _files(out).items() if p in old} == old

    # a NaN at item 50: a user error, found after blocks 0 and 1 were written
    bad = list(gen_samples(120, start=1000))
    bad[50]["vec"] = np.array([0.0, np.nan, 1.0], np.float32)
    with pytest.raises(SchemaError, match="sample 's001050': field 'vec': NaN"):
        build_shards(bad, out, overwrite=True, **opts)
    old_dataset_intact()
    assert _files(out) == old  # and what the failed build wrote is gone
    # an I/O error: the old dataset stays, the new build's finished blocks are kept
    with pytest.raises(OSError, match="went away at item 70") as info:
        build_shards(_failing_stream(120, 1000, at=70), out, overwrite=True, **opts)
    assert "without overwrite=True to resume" in info.value.__notes__[0]
    old_dataset_intact()
    assert any(p.startswith("_build/block-") for p in _files(out))
    with pytest.raises(OutputExistsError):  # another build does not get past the old manifest
        build_shards(list(gen_samples(3)), out)
    # the rerun without overwrite resumes the interrupted replacement
    m = build_shards(gen_samples(120, start=1000), out, **opts)
    _, data = read_dataset(out)
    assert m.num_samples == 120
    assert {k for split in data.values() for k in split} == {f"s{i:06d}" for i in range(1000, 1120)}
    assert not set(old) & set(_files(out)) - {"manifest.json", "README.md"}  # none of the old
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "a", "b", "manifest.json"]
    # a good overwrite straight away: the new one is complete, nothing of the replaced one stays
    replaced = set(_files(out)) - {"manifest.json", "README.md"}
    m = build_shards(list(gen_samples(50, start=5000)), out, overwrite=True, shard_max_count=20)
    _, data = read_dataset(out)
    assert m.num_samples == 50 and sorted(data["train"]) == [f"s{i:06d}" for i in range(5000, 5050)]
    assert not replaced & set(_files(out))


def test_manifest_records_build_parameters_and_loader_defaults(tmp_path):
    m = build_shards(
        list(gen_samples(4)),
        tmp_path / "ds",
        seed=7,
        shard_max_count=3,
        shard_max_bytes=1 << 20,
        loader_defaults={"collator": "default"},
        splits={"train": 0.5, "val": 0.5},
        group_by="i",
    )
    loaded = Manifest.load(tmp_path / "ds")
    assert loaded.to_dict() == m.to_dict()
    b = loaded.build
    assert (b["seed"], b["shard_max_count"], b["shard_max_bytes"], b["block_size"]) == (
        7,
        3,
        1 << 20,
        3,  # the default: one full shard (4 small samples cannot fill 16 blocks of >= 4 MiB)
    )
    assert b["group_by"] == "i" and b["key_field"] == "__key__" and "created" in b
    assert loaded.loader_defaults == {"collator": "default"}
    assert not (tmp_path / "ds" / "_build").exists()


def test_progress_callable_reaches_the_total(tmp_path):
    calls: list[tuple[int, int]] = []
    build_shards(
        list(gen_samples(300)), tmp_path / "ds", progress=lambda d, t: calls.append((d, t))
    )
    assert calls and calls[-1] == (300, 300)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_progress_true_draws_a_tqdm_bar(tmp_path, capsys):
    build_shards(list(gen_samples(50)), tmp_path / "ds", progress=True)
    err = capsys.readouterr().err
    assert "build-shards: 100%" in err and "sample/s" in err and "MB/s" in err


def test_zero_dimensional_arrays_keep_their_shape(tmp_path):
    rows = [{"x": np.array(i + 0.5, np.float32), "y": np.int64(i)} for i in range(6)]
    m = build_shards(rows, str(tmp_path / "s"))
    assert m.schema["x"].shape == [] and m.schema["y"].encoding == "cls"
    import torch

    from wdsloader import create_loader

    for gather in (True, False):
        loader = create_loader(
            str(tmp_path / "s"), "train", batch_size=6, shuffle=False, gather=gather
        )
        (batch,) = list(loader)
        assert batch["x"].shape == (6,) and batch["x"].tolist() == [i + 0.5 for i in range(6)]
        assert batch["y"].dtype == torch.int64 and batch["y"].tolist() == list(range(6))
