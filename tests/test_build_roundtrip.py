"""What a build accepts, the loader gives back as written; what it could not, the build refuses
(SchemaError naming the sample key and the field) and leaves no dataset behind."""

from __future__ import annotations

import numpy as np
import pytest

from build_shards import build_shards
from build_shards.errors import BuildError, SampleKeyError
from wdsloader import DecodeOptions, create_loader
from wdsloader.errors import SchemaError

I64 = np.iinfo(np.int64)


def _as_list(samples: list[dict]) -> list[dict]:
    return samples


def read_back(root, gather: bool) -> dict[str, dict]:
    """Every sample of ``train`` as the loader yields it (no collation), by key; raw bytes as
    ``bytes`` (as written; by default they read as uint8 arrays)."""
    loader = create_loader(
        root, "train", batch_size=4, shuffle=False, drop_last=False, pin_memory=False,
        collate_fn=_as_list, decode=DecodeOptions(gather=gather, raw_bytes="bytes"),
    )  # fmt: skip
    return {s["__key__"]: s for batch in loader for s in batch}


def _accepted_items() -> list[dict]:
    """Samples holding every kind of value the build accepts, extremes included."""
    labels = [0, int(I64.max), int(I64.min), -1, 7]
    texts = ["plain", "été ✓ 漢字", "nul\x00inside", "", "crlf\r\nend"]
    metas = [
        {"big_ints_in_a_list": [2**70, -(2**90)], "nested": {"a": [1, {"b": None}]}},
        {"unicode": "ünï ✓", "float": 1e300, "neg_zero": -0.0, "bool": True},
        [1, 2.5, "x", None, False],
        None,
        {"deep": [[[[[[[[[[1]]]]]]]]]]},
    ]
    return [
        {
            "__key__": f"s{i}-é",
            "emb": np.arange(3, dtype=np.float32) + i,
            "small": np.array([i, 255], np.uint8),
            "words": np.array(["ab", "c" * (i % 3)]),
            "when": np.array([i], "datetime64[D]"),
            "label": labels[i],
            "u8.cls": np.uint8(250 + i),
            "text": texts[i],
            "utf8bytes.txt": texts[i].encode("utf-8"),
            "meta": metas[i],
            "score": float(i) / 3,
            "flag": i % 2 == 0,
            "raw.bin": bytes(range(256))[i:] + b"\xff\xfe",
            "top.json": int(I64.max) - i,
        }
        for i in range(5)
    ]


@pytest.mark.parametrize("gather", [True, False])
def test_every_accepted_kind_of_value_reads_back_as_written(tmp_path, gather):
    items = _accepted_items()
    build_shards(items, tmp_path / "ds", shard_max_count=2)
    got = read_back(tmp_path / "ds", gather)
    assert sorted(got) == sorted(it["__key__"] for it in items)
    for item in items:
        s = got[item["__key__"]]
        for name in ("emb", "small", "words", "when"):
            assert s[name].dtype == item[name].dtype
            np.testing.assert_array_equal(s[name], item[name])
        assert s["label"] == item["label"]
        assert s["u8"] == item["u8.cls"] and s["u8"].dtype == np.uint8
        assert s["text"] == item["text"]
        assert s["utf8bytes"] == item["utf8bytes.txt"].decode("utf-8")
        assert s["meta"] == item["meta"]
        assert s["score"] == item["score"]
        assert s["flag"] is item["flag"]
        assert s["raw"] == item["raw.bin"]
        assert s["top"] == item["top.json"]


def _deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


# (field name, value of the good samples, value of the bad one, what the error says)
REFUSED = [
    ("label", 1, 2**70, r"int 1180591620717411303424 does not fit .* int64"),
    ("label", 1, -(2**63) - 1, "does not fit the field's dtype int64"),
    ("label", np.uint8(1), 300, r"int 300 does not fit the field's dtype uint8 \(\[0, 255\]\)"),
    ("label", np.uint8(1), -1, "int -1 does not fit the field's dtype uint8"),
    ("text", "ok", "bad \udcff surrogate", "a str is not valid Unicode"),
    ("text.txt", "ok", b"\xff\xfe not utf-8", r"bytes are not valid \.txt"),
    ("text.txt", b"ok", b"\xc3", r"bytes are not valid \.txt"),
    ("ids.id", b"1", b"12x", r"bytes are not valid \.id"),
    ("ids.id", b"1", str(2**64).encode(), "does not fit int64"),
    ("meta.jsn", b"{}", b"{not json", r"bytes are not valid \.jsn"),
    ("meta", {"a": 1.0}, {"a": float("nan")}, "NaN or Inf value"),
    ("meta", {"a": 1.0}, [float("inf")], "NaN or Inf value"),
    ("meta", {"a": "x"}, {"a": "\udcff"}, "a str is not valid Unicode"),
    ("meta", {"a": 1}, {"a": {1: "x"}}, "dict key 1 is a int: JSON reads it back as a str"),
    ("meta", {"a": 1}, {None: 1}, "dict key None is a NoneType"),
    ("meta", [1], _deep(5000), "nested deeper than 200 levels"),
    ("meta", [1], [{1, 2}], "set is not JSON serializable"),
    ("meta", [1], [np.array([None], dtype=object)], "ndarray is not JSON serializable"),
    ("top.json", 1, 2**64, "int 18446744073709551616 does not fit int64"),
    ("arr", np.zeros(2), np.array([None, 1], dtype=object), "dtype object is not stored"),
    ("a_long_field_name_of_thirty_two_", 1, 2, "longer than 100 bytes"),
]


@pytest.mark.usefixtures("infer_first_sample_only")  # the bad item comes after blocks
@pytest.mark.parametrize(("name", "good", "bad", "fragment"), REFUSED)
def test_values_the_loader_cannot_read_back_are_refused(tmp_path, name, good, bad, fragment):
    field = name.split(".")[0]
    bad_key = "b" * 70 if field.startswith("a_long") else "bad_one"
    items = [{"__key__": f"k{i}", name: good} for i in range(6)]
    items[4] = {"__key__": bad_key, name: bad}
    with pytest.raises(SchemaError, match=fragment) as err:
        build_shards(items, tmp_path / "ds", block_size=2)  # two blocks written before
    assert f"sample {bad_key!r}: field {field!r}" in str(err.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert not list((tmp_path / "ds").rglob("*.tar*"))


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (b"a\xffb", r"sample key b'a\\xffb' is not UTF-8"),
        ("a\udcffb", "is not valid Unicode"),
        ("a.b", "invalid sample key 'a.b'"),
        ("_x", "invalid sample key '_x'"),
        ("k" * 81, "longer than 80 bytes"),
    ],
)
def test_keys_readers_would_not_give_back_are_refused(tmp_path, key, fragment):
    items = [{"__key__": f"k{i}", "x": i} for i in range(4)]
    items[3]["__key__"] = key
    with pytest.raises(SampleKeyError, match=fragment) as err:
        build_shards(items, tmp_path / "ds", block_size=2)
    # one error class for both kinds of callers
    assert isinstance(err.value, SchemaError) and isinstance(err.value, BuildError)
    assert "source item 3: field '__key__'" in str(err.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_utf8_bytes_keys_read_back_as_their_text(tmp_path):
    items = [{"__key__": "é1".encode(), "x": 1}, {"__key__": "k2", "x": 2}]
    build_shards(items, tmp_path / "ds")
    assert sorted(read_back(tmp_path / "ds", gather=True)) == ["k2", "é1"]
