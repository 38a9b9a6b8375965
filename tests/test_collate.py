"""The collator registry, TaskSpec, and the ``default`` and ``causal_lm`` collators."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import wdsloader
from wdsloader.collate import (
    CausalLMCollator,
    CollatorInfo,
    CollatorRegistry,
    DefaultCollator,
    PackedCollator,
    TaskSpec,
    TextCollator,
    VisionCollator,
)

BUILTINS = r"default \(any\), text \(text\), vision \(vision\), causal_lm \(text\), packed \(any\)"


@pytest.fixture(autouse=True)
def _restore_registry():
    yield
    CollatorRegistry.reset()


def registry() -> CollatorRegistry:
    return CollatorRegistry.get_instance()


def get(name: str, **kwargs):
    return registry().get_collator(collator_name=name, **kwargs)


class Count:
    """A test collator (module level: picklable): the batch size times ``scale``."""

    def __init__(self, task_spec=None, scale: int = 1):
        self.task_spec, self.scale = task_spec, scale

    def __call__(self, samples):
        return len(samples) * self.scale


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------


def test_builtins_in_lookup_order():
    infos = registry().list_collators()
    assert [(i.name, i.modality) for i in infos] == [
        ("default", "any"),
        ("text", "text"),
        ("vision", "vision"),
        ("causal_lm", "text"),
        ("packed", "any"),
    ]
    assert [i.factory for i in infos] == [
        DefaultCollator,
        TextCollator,
        VisionCollator,
        CausalLMCollator,
        PackedCollator,
    ]
    assert all(isinstance(i, CollatorInfo) and i.description for i in infos)


def test_singleton_and_independent_registries():
    assert CollatorRegistry.get_instance() is registry()
    assert wdsloader.CollatorRegistry is CollatorRegistry and wdsloader.TaskSpec is TaskSpec
    own = CollatorRegistry()
    own.register("count", modality="audio")(Count)
    assert "count" in own and "count" not in registry()
    assert CollatorRegistry(builtins=False).list_collators() == []


def test_register_and_get_by_name_and_modality():
    @registry().register("count", modality="audio", description="how many samples")
    def count_factory(task_spec=None, scale: int = 1):
        return Count(task_spec, scale)

    assert count_factory(scale=2)([{}]) == 2  # the decorator returns the factory unchanged
    assert get("count")([{}, {}]) == 2
    assert get("count", scale=10)([{}]) == 10
    spec = TaskSpec(name="speech", task_type="classification", modality="audio")
    by_modality = registry().get_collator(task_spec=spec, scale=3)
    assert by_modality([{}, {}]) == 6 and by_modality.task_spec is spec
    info = registry().list_collators()[-1]
    assert (info.name, info.factory, info.modality) == ("count", count_factory, "audio")
    assert info.description == "how many samples"

    # A second collator for the same modality does not displace the first.
    registry().register("count2", modality="audio")(Count)
    assert registry().get_collator(spec).scale == 1 and get("count2", scale=5)([{}]) == 5
    assert registry().get_collator(spec, "count2", scale=7).scale == 7


def test_explicit_name_wins_and_gets_the_task_spec():
    spec = TaskSpec.vision_tiny()
    collate = registry().get_collator(task_spec=spec, collator_name="default")
    assert collate == DefaultCollator()
    registry().register("count", modality="audio")(Count)
    assert registry().get_collator(spec, "count").task_spec is spec
    assert get("count").task_spec is None


def test_lookup_errors_list_what_exists():
    with pytest.raises(ValueError, match=rf"unknown collator 'nope'; registered: {BUILTINS}$"):
        get("nope")
    tabular = TaskSpec(name="rows", task_type="classification", modality="tabular")
    with pytest.raises(
        ValueError,
        match=rf"no collator registered for modality 'tabular' \(task 'rows'\); "
        rf"registered: {BUILTINS}; register one or pass collator_name= \(e.g. 'default'\)",
    ):
        registry().get_collator(tabular)
    # the default collator serves no modality: only a caller naming it gets it
    with pytest.raises(ValueError, match="no collator registered for modality 'any'"):
        registry().get_collator(TaskSpec(name="x", task_type="lm", modality="any"))
    with pytest.raises(
        ValueError,
        match=rf"get_collator needs a task_spec or a collator_name; registered: {BUILTINS}",
    ):
        registry().get_collator()


def test_register_errors():
    with pytest.raises(ValueError, match="'default' is already registered; pass replace=True"):
        registry().register("default")(Count)
    registry().register("default", replace=True)(Count)
    assert get("default")([{"a": 1}]) == 1
    assert [i.name for i in registry().list_collators()][0] == "default"  # keeps its place
    with pytest.raises(TypeError, match="factory for 'late' must accept task_spec="):
        registry().register("late")(lambda scale=1: Count(None, scale))
    with pytest.raises(TypeError, match="factory for 'x' must be callable, got 3"):
        registry().register("x")(3)
    with pytest.raises(ValueError, match="collator name must be a non-empty string, got ''"):
        registry().register("")
    with pytest.raises(ValueError, match="modality must be a non-empty string, got None"):
        registry().register("x", modality=None)
    registry().register("broken")(lambda task_spec=None: "not callable")
    with pytest.raises(TypeError, match="collator factory 'broken' returned str, not a callable"):
        get("broken")


def test_reset_restores_the_builtins_in_place():
    before = registry()
    registry().register("count", modality="text")(Count)
    registry().register("text", replace=True, modality="text")(Count)
    again = CollatorRegistry.reset()
    assert again is before is registry()
    assert [i.name for i in again.list_collators()] == [
        "default",
        "text",
        "vision",
        "causal_lm",
        "packed",
    ]
    assert again.list_collators()[1].factory is TextCollator


# ------------------------------------------------------------------------------------------------
# TaskSpec
# ------------------------------------------------------------------------------------------------


def test_task_spec_presets():
    lm, cls_, s2s, vis = (
        TaskSpec.lm_tiny(),
        TaskSpec.cls_tiny(),
        TaskSpec.seq2seq_tiny(),
        TaskSpec.vision_tiny(),
    )
    assert [t.name for t in (lm, cls_, s2s, vis)] == [
        "lm_tiny",
        "cls_tiny",
        "seq2seq_tiny",
        "vision_tiny",
    ]
    assert [t.task_type for t in (lm, cls_, s2s, vis)] == [
        "lm",
        "classification",
        "seq2seq",
        "vision_classification",
    ]
    assert [t.modality for t in (lm, cls_, s2s, vis)] == ["text", "text", "text", "vision"]
    assert lm.input_fields == ["input_ids", "attention_mask"] and lm.target_field == "labels"
    assert s2s.input_fields[-1] == "decoder_input_ids"
    assert lm.special_tokens == {"pad_token_id": 0} and cls_.output_schema == {"num_classes": 2}
    assert vis.input_fields == ["pixel_values"] and vis.input_schema["image_size"] == [3, 32, 32]
    assert vis.preprocessing_config == {"normalize": "imagenet"}
    # each call is a new spec: changing one does not change the preset
    vis.preprocessing_config["normalize"] = "cifar10"
    assert TaskSpec.vision_tiny().preprocessing_config == {"normalize": "imagenet"}
    assert isinstance(registry().get_collator(TaskSpec.vision_tiny()), VisionCollator)


def test_task_spec_round_trip_and_errors():
    spec = TaskSpec.seq2seq_tiny()
    assert TaskSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\]"):
        TaskSpec.from_dict({**spec.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="TaskSpec.modality must be a non-empty string, got ''"):
        TaskSpec(name="x", task_type="lm", modality="")
    with pytest.raises(TypeError, match="input_fields is a list of names, got 'input_ids'"):
        TaskSpec(name="x", task_type="lm", input_fields="input_ids")
    minimal = TaskSpec(name="x", task_type="lm")
    assert minimal.modality == "text" and minimal.preprocessing_config == {}


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
    b = get("default")(samples)
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
    b = get("default")(samples)
    samples[0]["vec"][0] = 99
    assert b["vec"][0, 0].item() == 0


def test_mixed_numbers_and_non_numeric_arrays():
    c = get("default")
    assert c([{"x": 1}, {"x": 2.5}])["x"].dtype == torch.float32
    assert c([{"x": 1}, {"x": True}])["x"] == [1, True]  # mixed types: kept as a list
    strings = [{"s": np.array(["a", "b"])}, {"s": np.array(["c", "d"])}]
    out = c(strings)["s"]
    assert isinstance(out, list) and [a.tolist() for a in out] == [["a", "b"], ["c", "d"]]


def test_ragged_values_stay_lists_unless_stacking_was_asked():
    samples = _samples(3)
    samples[2]["vec"] = np.zeros(5, dtype=np.float32)
    samples[1]["t"] = torch.zeros(3, dtype=torch.int64)
    b = get("default")(samples)
    assert isinstance(b["vec"], list) and [v.shape for v in b["vec"]] == [(4,), (4,), (5,)]
    assert b["vec"][2] is samples[2]["vec"]
    assert isinstance(b["t"], list) and [list(t.shape) for t in b["t"]] == [[2], [3], [2]]
    assert b["mat"].shape == (3, 2, 3)  # the other fields still stack
    with pytest.raises(
        ValueError,
        match=r"field 'vec': sample 'k0' has shape \[4\] float32 but sample 'k2' has shape "
        r"\[5\] float32; cannot stack",
    ):
        get("default", stack=["vec"])(samples)
    with pytest.raises(ValueError, match=r"field 't'.*sample 'k1' has shape \[3\] torch.int64"):
        get("default", stack=["t"])(samples)
    samples = _samples(2)
    samples[1]["vec"] = samples[1]["vec"].astype(np.float64)
    assert isinstance(get("default")(samples)["vec"], list)
    with pytest.raises(ValueError, match=r"field 'vec'.*sample 'k1' has shape \[4\] float64"):
        get("default", stack=("vec",))(samples)


def test_stack_turns_equal_lists_into_tensors_and_refuses_the_rest():
    samples = [{"__key__": "a", "ids": [1, 2], "s": "x"}, {"__key__": "b", "ids": [3, 4], "s": "y"}]
    assert get("default")(samples)["ids"] == [[1, 2], [3, 4]]
    assert get("default", stack=["ids"])(samples)["ids"].tolist() == [[1, 2], [3, 4]]
    samples[1]["ids"] = [3]
    with pytest.raises(ValueError, match=r"field 'ids': sample 'a' has shape \[2\] int64 but "):
        get("default", stack=["ids"])(samples)
    with pytest.raises(ValueError, match=r"field 's' holds \['str'\]; cannot stack"):
        get("default", stack=["s"])(samples)
    with pytest.raises(ValueError, match=r"stack names \['nope'\], which sample 'a' lacks"):
        get("default", stack=["nope"])(samples)
    with pytest.raises(TypeError, match="stack takes field names, got the string 'ids'"):
        get("default", stack="ids")
    strings = [{"s": np.array(["a"])}, {"s": np.array(["b"])}]
    with pytest.raises(ValueError, match="field 's' holds <U1 arrays; cannot stack"):
        get("default", stack=["s"])(strings)


def test_collate_columns_matches_rows():
    c = get("default")
    columns = {"__key__": ["a", "b"], "v": np.ones((2, 3), np.float32), "m": [{}, {"x": 1}]}
    out = c.collate_columns(columns)
    rows = c(
        [{"__key__": k, "v": columns["v"][i], "m": columns["m"][i]} for i, k in enumerate("ab")]
    )
    assert out["__key__"] == rows["__key__"] == ["a", "b"] and out["m"] == rows["m"]
    assert torch.equal(out["v"], rows["v"])


@pytest.mark.parametrize("big", [1e300, -1e39, 2.0**128])
def test_floats_float32_cannot_hold_raise_naming_field_key_value_and_the_way_out(big):
    """A finite float beyond float32's range would become +-inf: a ValueError naming the field,
    the sample and the value, and ``float64=`` keeps the field float64 in every batch."""
    samples = [{"__key__": "a", "y": 0.5, "n": 1}, {"__key__": "b", "y": big, "n": 2}]
    with pytest.raises(
        ValueError,
        match=rf"field 'y' of sample 'b' holds {re.escape(repr(big))}, which float32 cannot hold \(it would "
        r"become inf\); keep the field float64 with collate_options=\{'float64': \['y'\]\} "
        r"\(DefaultCollator\(float64=\['y'\]\)\)",
    ):
        get("default")(samples)
    columns = {"__key__": ["a", "b"], "y": [0.5, big]}
    with pytest.raises(ValueError, match=r"field 'y' of sample 'b' holds"):
        get("default").collate_columns(columns)
    for out in (
        get("default", float64=["y"])(samples),
        DefaultCollator(float64=["y"]).collate_columns(columns),
    ):
        assert out["y"].dtype == torch.float64 and out["y"].tolist() == [0.5, big]
    small = get("default", float64=["y"])([{"y": 0.5}, {"y": 2}])["y"]  # every batch: float64
    assert small.dtype == torch.float64 and small.tolist() == [0.5, 2.0]
    assert get("default")([{"y": float("inf")}, {"y": 3.4e38}])["y"].tolist()[0] == float("inf")
    with pytest.raises(TypeError, match="float64 takes field names, got the string 'y'"):
        DefaultCollator(float64="y")


@pytest.mark.parametrize("float64", [(), ("y",)], ids=["float32", "float64"])
def test_an_int_beyond_float64_among_floats_is_a_value_error_naming_field_and_sample(float64):
    # the error path itself compared the int with a float and raised a bare OverflowError
    samples = [{"__key__": "a", "y": 0.5}, {"__key__": "b", "y": -(10**400)}]
    with pytest.raises(ValueError, match=r"^field 'y' of sample 'b' holds an int beyond float64"):
        DefaultCollator(float64=float64)(samples)


def test_different_field_sets_and_empty_batch():
    samples = _samples(2)
    del samples[1]["label"]
    with pytest.raises(ValueError, match=r"samples 'k0' and 'k1' have different fields.*'label'"):
        get("default")(samples)
    with pytest.raises(ValueError, match="empty batch"):
        get("default")([])


# ------------------------------------------------------------------------------------------------
# causal_lm
# ------------------------------------------------------------------------------------------------


def test_causal_lm_shift():
    samples = [
        {"__key__": "a", "tokens": np.array([1, 2, 3, 4], dtype=np.int32)},
        {"__key__": "b", "tokens": np.array([5, 6, 7, 8], dtype=np.int32)},
    ]
    b = get("causal_lm")(samples)
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
    b = get("causal_lm", field="ids", pad_id=0)(samples)
    assert b["input_ids"].tolist() == [[10, 11, 0, 0], [20, 21, 22, 0], [30, 31, 32, 33]]
    assert b["labels"].tolist() == [[11, -100, -100, -100], [21, 22, -100, -100], [31, 32, 33, 34]]
    assert b["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert "__key__" not in b


def test_causal_lm_errors():
    c = get("causal_lm")
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
