"""The collator registry and the built-in collators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wdsloader.collate import CollatorInfo, get_collator, list_collators, register_collator
from wdsloader.collate import collators as col


@pytest.fixture(autouse=True)
def _restore_registry():
    factories, info = dict(col._FACTORIES), dict(col._INFO)
    yield
    col._FACTORIES.clear()
    col._FACTORIES.update(factories)
    col._INFO.clear()
    col._INFO.update(info)


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------


def test_builtins_are_listed():
    infos = {i.name: i for i in list_collators()}
    assert infos["default"].modality == "any"
    assert infos["causal_lm"].modality == "text"
    assert isinstance(infos["causal_lm"], CollatorInfo) and infos["causal_lm"].description
    assert [i.name for i in list_collators()][:2] == ["default", "causal_lm"]


def test_register_and_get_by_name_and_modality():
    @register_collator("count", modality="audio", description="how many samples")
    def count_factory(scale: int = 1):
        return lambda samples: len(samples) * scale

    assert get_collator("count")([{}, {}]) == 2
    assert get_collator("count", scale=10)([{}]) == 10
    assert get_collator(modality="audio", scale=3)([{}, {}]) == 6
    assert CollatorInfo("count", "audio", "how many samples") in list_collators()

    # A second collator for the same modality does not displace the first.
    register_collator("count2", modality="audio")(lambda: lambda samples: -1)
    assert get_collator(modality="audio")([{}]) == 1
    assert get_collator("count2")([{}]) == -1


def test_duplicate_names_need_replace():
    with pytest.raises(ValueError, match="'default' is already registered; pass replace=True"):
        register_collator("default")(lambda: lambda s: s)
    register_collator("default", replace=True)(lambda: lambda s: "mine")
    assert get_collator()([{"a": 1}]) == "mine"


def test_unknown_name_or_modality_is_an_error():
    with pytest.raises(ValueError, match=r"unknown collator 'nope'; registered: \['causal_lm', "):
        get_collator("nope")
    with pytest.raises(
        ValueError,
        match=r"no collator registered for modality 'image'; modalities: \['any', 'text'\]",
    ):
        get_collator(modality="image")
    with pytest.raises(
        ValueError, match="collator 'causal_lm' is for modality 'text', not 'audio'"
    ):
        get_collator("causal_lm", modality="audio")
    # "any" serves every modality when named explicitly.
    get_collator("default", modality="audio")


def test_modality_lookup_and_default():
    text = get_collator(modality="text")
    batch = text([{"tokens": np.array([1, 2, 3])}])
    assert batch["input_ids"].tolist() == [[1, 2]]
    default = get_collator()
    assert default([{"x": 1}])["x"].tolist() == [1]


# ------------------------------------------------------------------------------------------------
# default
# ------------------------------------------------------------------------------------------------


def _samples(n: int = 3) -> list[dict]:
    return [
        {
            "__key__": f"k{i}",
            "vec": np.arange(4, dtype=np.float32) + i,
            "mat": np.full((2, 3), i, dtype=np.int16),
            "label": i,
            "score": i / 4,
            "flag": i % 2 == 0,
            "cid": np.int32(i * 10),
            "dist": np.float64(i) / 8,
            "t": torch.tensor([i, -i]),
            "text": f"s{i}",
            "blob": bytes([i]),
            "meta": {"i": i},
            "tags": [i],
            "none": None,
        }
        for i in range(n)
    ]


def test_default_collator_values_dtypes_shapes():
    samples = _samples()
    b = get_collator()(samples)
    assert list(b) == list(samples[0])
    assert b["__key__"] == ["k0", "k1", "k2"]
    assert b["vec"].dtype == torch.float32 and b["vec"].shape == (3, 4)
    assert b["vec"].tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
    assert b["mat"].dtype == torch.int16 and b["mat"].shape == (3, 2, 3)
    assert b["mat"][:, 0, 0].tolist() == [0, 1, 2]
    assert b["label"].dtype == torch.int64 and b["label"].tolist() == [0, 1, 2]
    assert b["score"].dtype == torch.float32 and b["score"].tolist() == [0.0, 0.25, 0.5]
    assert b["flag"].dtype == torch.bool and b["flag"].tolist() == [True, False, True]
    assert b["cid"].dtype == torch.int32 and b["cid"].tolist() == [0, 10, 20]
    assert b["dist"].dtype == torch.float64 and b["dist"].tolist() == [0.0, 0.125, 0.25]
    assert b["t"].dtype == torch.int64 and b["t"].tolist() == [[0, 0], [1, -1], [2, -2]]
    assert b["text"] == ["s0", "s1", "s2"]
    assert b["blob"] == [b"\x00", b"\x01", b"\x02"]
    assert b["meta"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert b["tags"] == [[0], [1], [2]]
    assert b["none"] == [None, None, None]


def test_default_collator_copies_arrays():
    samples = _samples(2)
    b = get_collator()(samples)
    samples[0]["vec"][0] = 99
    assert b["vec"][0, 0].item() == 0


def test_mixed_numbers_and_non_numeric_arrays():
    c = get_collator()
    assert c([{"x": 1}, {"x": 2.5}])["x"].dtype == torch.float32
    assert c([{"x": 1}, {"x": True}])["x"] == [1, True]  # mixed types: kept as a list
    strings = [{"s": np.array(["a", "b"])}, {"s": np.array(["c", "d"])}]
    out = c(strings)["s"]
    assert isinstance(out, list) and [a.tolist() for a in out] == [["a", "b"], ["c", "d"]]


def test_mismatched_shapes_name_field_and_keys():
    samples = _samples(3)
    samples[2]["vec"] = np.zeros(5, dtype=np.float32)
    with pytest.raises(
        ValueError,
        match=r"field 'vec': sample 'k0' has shape \[4\] float32 but sample 'k2' has shape \[5\]",
    ):
        get_collator()(samples)
    samples = _samples(2)
    samples[1]["vec"] = samples[1]["vec"].astype(np.float64)
    with pytest.raises(ValueError, match=r"field 'vec'.*sample 'k1' has shape \[4\] float64"):
        get_collator()(samples)
    samples = _samples(2)
    samples[1]["t"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"field 't'.*sample 'k1' holds shape \[3\]"):
        get_collator()(samples)


def test_different_field_sets_and_empty_batch():
    samples = _samples(2)
    del samples[1]["label"]
    with pytest.raises(ValueError, match=r"samples 'k0' and 'k1' have different fields.*'label'"):
        get_collator()(samples)
    with pytest.raises(ValueError, match="empty batch"):
        get_collator()([])


# ------------------------------------------------------------------------------------------------
# causal_lm
# ------------------------------------------------------------------------------------------------


def test_causal_lm_shift():
    samples = [
        {"__key__": "a", "tokens": np.array([1, 2, 3, 4], dtype=np.int32)},
        {"__key__": "b", "tokens": np.array([5, 6, 7, 8], dtype=np.int32)},
    ]
    b = get_collator("causal_lm")(samples)
    assert set(b) == {"input_ids", "labels", "attention_mask", "__key__"}
    assert b["input_ids"].tolist() == [[1, 2, 3], [5, 6, 7]]
    assert b["labels"].tolist() == [[2, 3, 4], [6, 7, 8]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]
    for name in ("input_ids", "labels", "attention_mask"):
        assert b[name].dtype == torch.int64
    assert b["__key__"] == ["a", "b"]


def test_causal_lm_padding():
    samples = [
        {"ids": [10, 11, 0, 0]},  # already padded with pad_id 0
        {"ids": np.array([20, 21, 22])},  # shorter: right-padded
        {"ids": torch.tensor([30, 31, 32, 33, 34])},
    ]
    b = get_collator("causal_lm", field="ids", pad_id=0)(samples)
    assert b["input_ids"].tolist() == [[10, 11, 0, 0], [20, 21, 22, 0], [30, 31, 32, 33]]
    assert b["labels"].tolist() == [[11, -100, -100, -100], [21, 22, -100, -100], [31, 32, 33, 34]]
    assert b["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert "__key__" not in b


def test_causal_lm_errors():
    c = get_collator("causal_lm")
    uneven = [{"__key__": "a", "tokens": [1, 2, 3]}, {"__key__": "b", "tokens": [1, 2]}]
    with pytest.raises(ValueError, match="3 tokens in sample 'a' but 2 in sample 'b'; pass pad_id"):
        c(uneven)
    with pytest.raises(ValueError, match="1-D integer array .* dtype float32"):
        c([{"__key__": "a", "tokens": np.ones(3, np.float32)}])
    with pytest.raises(ValueError, match=r"at least 2 token ids, got shape \[1\]"):
        c([{"tokens": [1]}])
    with pytest.raises(ValueError, match=r"sample 'x' has no field 'tokens'; its fields: \['__key"):
        c([{"__key__": "x", "ids": [1, 2]}])
    with pytest.raises(ValueError, match="empty batch"):
        c([])
