"""Curriculum fields: schedules, per-key draws, (de)serialisation and output schema."""

from __future__ import annotations

import json
import math
import pickle
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest

from wdsloader.curriculum import (
    Curriculum,
    Schedule,
    cosine,
    fixed,
    from_callable,
    linear,
    schedule_from_dict,
    steps,
    zero_decay,
)
from wdsloader.format.manifest import FieldSpec

VARIANTS = {
    "zero": None,
    "centroid": "steering_centroid",
    "keyword": "steering_keyword",
    "residual": "steering_residual",
}
NAMES = ("zero", "centroid", "keyword", "residual")
KEYS = [f"q{i:07d}" for i in range(20_000)]


@pytest.fixture(scope="module")
def cur() -> Curriculum:
    return Curriculum(VARIANTS)


def _schema(**overrides: FieldSpec) -> dict[str, FieldSpec]:
    schema = {
        "question_emb": FieldSpec(
            ext="question_emb.npy", encoding="npy", dtype="float32", shape=["D"]
        ),
        "steering_centroid": FieldSpec(
            ext="steering_centroid.npy", encoding="npy", dtype="float32", shape=["D"]
        ),
        "steering_keyword": FieldSpec(
            ext="steering_keyword.npy", encoding="npy", dtype="float32", shape=["D"]
        ),
        "steering_residual": FieldSpec(
            ext="steering_residual.npy", encoding="npy", dtype="float32", shape=["D"]
        ),
        "cluster_id": FieldSpec(ext="cluster_id.cls", encoding="cls", dtype="int64", shape=[]),
    }
    schema.update(overrides)
    return schema


# -- the reference schedule ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (0, [0.5, 1 / 6, 1 / 6, 1 / 6]),
        (25, [0.4, 0.2, 0.2, 0.2]),
        (50, [0.3, 0.7 / 3, 0.7 / 3, 0.7 / 3]),
        (75, [0.2, 0.8 / 3, 0.8 / 3, 0.8 / 3]),
        (100, [0.1, 0.3, 0.3, 0.3]),
        (150, [0.1, 0.3, 0.3, 0.3]),
    ],
)
def test_reference_table(cur: Curriculum, epoch: int, expected: list[float]) -> None:
    p = cur.probabilities(epoch)
    assert p.dtype == np.float64 and p.shape == (4,)
    np.testing.assert_allclose(p, expected, atol=1e-12)
    # the reference fixture's explicit base (0.25 each, zero's entry ignored) gives the same
    explicit = zero_decay({n: 0.25 for n in NAMES}).probabilities(epoch, NAMES)
    np.testing.assert_allclose(explicit, expected, atol=1e-12)


def test_default_schedule(cur: Curriculum) -> None:
    assert cur.schedule == zero_decay()
    no_zero = Curriculum({"a": "fa", "b": "fb", "c": None})
    np.testing.assert_allclose(no_zero.probabilities(7), [1 / 3] * 3)
    assert no_zero.schedule.to_dict()["kind"] == "fixed"


def test_zero_decay_base_and_options() -> None:
    s = zero_decay({"centroid": 2.0, "keyword": 1.0, "residual": 1.0}, start=0.8, end=0.0, epochs=4)
    np.testing.assert_allclose(s.probabilities(0, NAMES), [0.8, 0.1, 0.05, 0.05])
    np.testing.assert_allclose(s.probabilities(2, NAMES), [0.4, 0.3, 0.15, 0.15])
    np.testing.assert_allclose(s.probabilities(9, NAMES), [0.0, 0.5, 0.25, 0.25])
    other = zero_decay([0.0, 1.0, 0.0, 1.0], zero="keyword", start=0.2, end=0.2, epochs=1)
    np.testing.assert_allclose(other.probabilities(3, NAMES), [0.0, 0.4, 0.2, 0.4])


# -- draws ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("epoch", [0, 50, 100])
def test_draw_frequencies_follow_schedule(cur: Curriculum, epoch: int) -> None:
    drawn = cur.draw(KEYS, epoch, seed=1234)
    assert drawn.dtype == np.int64 and drawn.shape == (len(KEYS),)
    freq = np.bincount(drawn, minlength=4) / len(KEYS)
    np.testing.assert_allclose(freq, cur.probabilities(epoch), atol=0.02)


def test_draw_is_pure_function_of_seed_epoch_key(cur: Curriculum) -> None:
    keys = KEYS[:3000]
    full = dict(zip(keys, cur.draw(keys, 7, seed=99).tolist(), strict=True))
    shuffled = keys[:]
    random.Random(0).shuffle(shuffled)
    # uneven batches of the shuffled order, as different workers / ranks would see them
    got: dict[str, int] = {}
    i = 0
    for size in [1, 5, 256, 17, 1000] * 10:
        batch = shuffled[i : i + size]
        got.update(zip(batch, cur.draw(batch, 7, seed=99).tolist(), strict=True))
        i += size
    assert i >= len(keys) and got == full
    # a fresh instance built from the same description (a worker, a resumed run) agrees
    again = Curriculum.from_dict(json.loads(json.dumps(cur.to_dict())))
    assert again.draw(keys, 7, seed=99).tolist() == [full[k] for k in keys]


def test_pickled_curriculum_draws_the_same(cur: Curriculum) -> None:
    for c in (cur, Curriculum(VARIANTS, schedule=steps({0: [1, 0, 0, 0], 2: [0.25] * 4}))):
        back = pickle.loads(pickle.dumps(c))
        assert back.draw(KEYS[:1000], 5, 8).tolist() == c.draw(KEYS[:1000], 5, 8).tolist()


def test_fresh_process_draws_the_same_and_imports_no_torch(cur: Curriculum) -> None:
    code = (
        "import sys; from wdsloader.curriculum import Curriculum;"
        f"c = Curriculum({VARIANTS!r});"
        "print([c.draw([f'q{i:07d}' for i in range(200)], 3, 5).tolist(), 'torch' in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    drawn, torch_loaded = json.loads(out.replace("False", "false").replace("True", "true"))
    assert drawn == cur.draw(KEYS[:200], 3, 5).tolist()
    assert not torch_loaded


def test_draw_changes_with_epoch_and_seed() -> None:
    c = Curriculum(VARIANTS, schedule=fixed([0.25] * 4))  # same probabilities every epoch
    base = c.draw(KEYS[:5000], 3, seed=1)
    for other in (c.draw(KEYS[:5000], 4, seed=1), c.draw(KEYS[:5000], 3, seed=2)):
        changed = np.mean(base != other)
        assert 0.65 < changed < 0.85  # ~0.75 for independent uniform draws over 4 variants


def test_zero_probability_never_drawn() -> None:
    c = Curriculum(VARIANTS, schedule=fixed({"zero": 0.0, "centroid": 0.5, "residual": 0.5}))
    drawn = c.draw(KEYS, 0, seed=0)
    assert set(np.unique(drawn).tolist()) == {1, 3}
    only_last = Curriculum(VARIANTS, schedule=fixed([0, 0, 0, 1]))
    assert (only_last.draw(KEYS[:2000], 0, seed=0) == 3).all()
    only_first = Curriculum(VARIANTS, schedule=fixed([1, 0, 0, 0]))
    assert (only_first.draw(KEYS[:2000], 0, seed=0) == 0).all()


def test_zero_probability_at_extreme_uniforms(monkeypatch: pytest.MonkeyPatch) -> None:
    import wdsloader.curriculum.curriculum as mod

    u = np.array([0.0, 1e-300, 2.0**-53, 0.55, 1.0 - 2.0**-52, 1.0 - 2.0**-53])
    monkeypatch.setattr(mod, "_uniforms", lambda keys, epoch, seed: u[: len(keys)])
    keys = ["k"] * len(u)
    names = {f"v{i}": f"f{i}" for i in range(12)}
    # zeros first, in the middle and last
    probs = [0.0, 0.0, 0.1, 0.1, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 0.0]
    c = Curriculum(names, schedule=fixed(probs))
    assert c.draw(keys, 0, 0).tolist() == [2, 2, 2, 8, 10, 10]
    c = Curriculum(names, schedule=fixed([0.1] * 10 + [0.0, 0.0]))  # cumsum 0.9999999999999999
    assert c.draw(keys, 0, 0).tolist() == [0, 0, 0, 5, 9, 9]
    c = Curriculum(names, schedule=fixed([0.0] * 11 + [1.0]))
    assert c.draw(keys, 0, 0).tolist() == [11] * 6


def test_draw_edge_inputs(cur: Curriculum) -> None:
    assert cur.draw([], 0, 0).dtype == np.int64 and len(cur.draw([], 0, 0)) == 0
    assert cur.draw(np.array(KEYS[:10]), 0, 0).tolist() == cur.draw(KEYS[:10], 0, 0).tolist()
    assert (
        cur.draw(["q0000001"], np.int64(3), np.int32(4)).tolist()
        == cur.draw(["q0000001"], 3, 4).tolist()
    )
    with pytest.raises(ValueError, match="not a string"):
        cur.draw(["a", 3], 0, 0)  # type: ignore[list-item]


# -- schedule kinds -----------------------------------------------------------------------------
def test_fixed() -> None:
    s = fixed({"centroid": 0.25, "keyword": 0.75})
    np.testing.assert_allclose(s.probabilities(0, NAMES), [0, 0.25, 0.75, 0])
    np.testing.assert_allclose(s.probabilities(1000, NAMES), [0, 0.25, 0.75, 0])
    np.testing.assert_allclose(
        fixed([0.1, 0.2, 0.3, 0.4]).probabilities(5, NAMES), [0.1, 0.2, 0.3, 0.4]
    )


def test_linear() -> None:
    s = linear([1, 0, 0, 0], {"centroid": 0.5, "residual": 0.5}, epochs=10)
    np.testing.assert_allclose(s.probabilities(0, NAMES), [1, 0, 0, 0])
    np.testing.assert_allclose(s.probabilities(4, NAMES), [0.6, 0.2, 0, 0.2])
    np.testing.assert_allclose(s.probabilities(10, NAMES), [0, 0.5, 0, 0.5])
    np.testing.assert_allclose(s.probabilities(30, NAMES), [0, 0.5, 0, 0.5])


def test_cosine() -> None:
    s = cosine([1, 0, 0, 0], [0, 0, 0, 1], epochs=4)
    np.testing.assert_allclose(s.probabilities(0, NAMES), [1, 0, 0, 0], atol=1e-15)
    half = (1 + math.cos(math.pi / 4)) / 2  # weight of start after 1 of 4 epochs
    np.testing.assert_allclose(s.probabilities(1, NAMES), [half, 0, 0, 1 - half])
    np.testing.assert_allclose(s.probabilities(2, NAMES), [0.5, 0, 0, 0.5])
    np.testing.assert_allclose(s.probabilities(4, NAMES), [0, 0, 0, 1], atol=1e-15)
    np.testing.assert_allclose(s.probabilities(99, NAMES), [0, 0, 0, 1], atol=1e-15)


def test_steps() -> None:
    rows = {10: [0, 1, 0, 0], 0: {"zero": 1.0}, 25: [0.25] * 4}
    for s in (steps(rows), steps(list(rows.items()))):
        np.testing.assert_allclose(s.probabilities(0, NAMES), [1, 0, 0, 0])
        np.testing.assert_allclose(s.probabilities(9, NAMES), [1, 0, 0, 0])
        np.testing.assert_allclose(s.probabilities(10, NAMES), [0, 1, 0, 0])
        np.testing.assert_allclose(s.probabilities(24, NAMES), [0, 1, 0, 0])
        np.testing.assert_allclose(s.probabilities(25, NAMES), [0.25] * 4)
        np.testing.assert_allclose(s.probabilities(10_000, NAMES), [0.25] * 4)


def test_from_callable_and_plain_callable() -> None:
    def fn(epoch: int) -> list[float]:
        return [1.0, 0, 0, 0] if epoch < 2 else [0, 0, 0.5, 0.5]

    for c in (Curriculum(VARIANTS, schedule=fn), Curriculum(VARIANTS, schedule=from_callable(fn))):
        np.testing.assert_allclose(c.probabilities(1), [1, 0, 0, 0])
        np.testing.assert_allclose(c.probabilities(2), [0, 0, 0.5, 0.5])
        with pytest.raises(ValueError, match="cannot be serialised"):
            c.to_dict()
    s = from_callable(lambda e: {"zero": 1.0} if e < 3 else {"zero": 0.5, "bogus": 0.5})
    c = Curriculum(VARIANTS, schedule=s)
    with pytest.raises(ValueError, match=r"epoch 3: unknown variant 'bogus'; valid variants: zero"):
        c.probabilities(3)
    with pytest.raises(ValueError, match=r"epoch 5: .*sum to 0\.8"):
        from_callable(lambda e: [0.2] * 4).probabilities(5, NAMES)
    with pytest.raises(
        ValueError,
        match=r"schedule function at epoch 0: probability -0\.5 for position 0 is negative",
    ):
        Curriculum(VARIANTS, schedule=lambda e: [-0.5, 0.5, 0.5, 0.5])  # checked at construction


# -- (de)serialisation --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schedule",
    [
        None,
        zero_decay({"centroid": 2, "keyword": 1, "residual": 1}, start=0.9, end=0.05, epochs=7),
        zero_decay([0, 1, 1, 2]),
        fixed({"zero": 0.5, "keyword": 0.5}),
        fixed([0.1, 0.2, 0.3, 0.4]),
        linear([1, 0, 0, 0], {"residual": 1.0}, 5),
        cosine({"zero": 1.0}, [0.25] * 4, 9),
        steps({0: [1, 0, 0, 0], 3: {"keyword": 1.0}, 8: [0.25] * 4}),
    ],
)
def test_round_trip(schedule: Schedule | None) -> None:
    c = Curriculum(VARIANTS, output="steer", index_output="steer_idx", schedule=schedule, seed=17)
    data = json.loads(json.dumps(c.to_dict()))
    assert list(data["variants"]) == list(NAMES) and data["variants"]["zero"] is None
    assert data["output"] == "steer" and data["index_output"] == "steer_idx" and data["seed"] == 17
    back = Curriculum.from_dict(data)
    assert back.names == c.names and back.fields == c.fields and back.seed == 17
    assert back.schedule == c.schedule
    assert schedule_from_dict(data["schedule"]) == c.schedule
    for epoch in (0, 1, 4, 6, 8, 20, 200):
        np.testing.assert_array_equal(back.probabilities(epoch), c.probabilities(epoch))
        assert back.draw(KEYS[:500], epoch, 3).tolist() == c.draw(KEYS[:500], epoch, 3).tolist()


def test_from_dict_errors() -> None:
    with pytest.raises(ValueError, match="unknown kind 'exp'; kinds: fixed"):
        schedule_from_dict({"kind": "exp"})
    with pytest.raises(ValueError, match="linear schedule dict: missing 'epochs'"):
        schedule_from_dict({"kind": "linear", "start": [1], "end": [1]})
    with pytest.raises(ValueError, match=r"unknown keys \['variant'\]"):
        Curriculum.from_dict({"variant": VARIANTS})
    with pytest.raises(ValueError, match="missing 'variants'"):
        Curriculum.from_dict({"output": "x"})
    steps_json = {"kind": "steps", "table": {"0": [1.0], "5": [1.0]}}  # JSON object form
    assert schedule_from_dict(steps_json) == steps({0: [1.0], 5: [1.0]})


# -- names, fields, indices ---------------------------------------------------------------------
def test_names_fields_index(cur: Curriculum) -> None:
    assert cur.names == NAMES
    assert cur.fields == ("steering_centroid", "steering_keyword", "steering_residual")
    assert cur.output == "steering" and cur.index_output == "steering_variant" and cur.seed is None
    assert [cur.index(n) for n in NAMES] == [0, 1, 2, 3]
    assert [cur.field_of(i) for i in range(4)] == [None, *cur.fields]
    with pytest.raises(
        ValueError, match="unknown curriculum variant 'none'; valid variants: zero, "
    ):
        cur.index("none")
    with pytest.raises(ValueError, match=r"variant index 4 out of range \[0, 4\)"):
        cur.field_of(4)


# -- invalid input ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: fixed({"zero": 0.5, "bogus": 0.5}).probabilities(0, NAMES),
            r"unknown variant 'bogus'; valid variants: zero, centroid, keyword, residual",
        ),
        (
            lambda: Curriculum(VARIANTS, schedule=fixed({"zero": 0.5, "nope": 0.5})),
            r"unknown variant 'nope'; valid variants: zero, centroid",
        ),
        (
            lambda: Curriculum(VARIANTS, schedule=fixed([0.5, 0.5])),
            r"2 probabilities for 4 variants",
        ),
        (
            lambda: fixed([0.5, -0.25, 0.75]),
            r"fixed schedule: probability -0\.25 for position 1 is negative",
        ),
        (
            lambda: fixed([0.5, float("nan"), 0.5]),
            "fixed schedule: probability for position 1 is NaN",
        ),
        (lambda: fixed({"zero": float("nan")}), "probability for 'zero' is NaN"),
        (lambda: fixed([0.5, 0.2, 0.2]), r"probabilities sum to 0\.9, not 1"),
        (lambda: fixed({"zero": 0.7, "centroid": 0.7}), r"probabilities sum to 1\.4, not 1"),
        (lambda: fixed("0.5"), "expected a mapping name -> probability or a sequence"),
        (lambda: fixed([0.5, "x", 0.5]), r"probability 'x' for position 1 is not a number"),
        (lambda: Curriculum({}), "empty"),
        (lambda: Curriculum({"a b": "f"}), r"invalid variant name 'a b'"),
        (lambda: Curriculum({"": "f"}), r"invalid variant name ''"),
        (lambda: Curriculum({"a": "f", "b": "f"}), r"variants 'a' and 'b' both map to 'f'"),
        (lambda: Curriculum({"a": None, "b": None, "c": "f"}), r"'a' and 'b' both map to the zero"),
        (lambda: Curriculum({"a": 3}), r"variant 'a': field must be a non-empty string or None"),
        (lambda: Curriculum({"a": None}), "at least one variant must map to a stored field"),
        (lambda: Curriculum(VARIANTS, index_output="steering"), "index_output and output are both"),
        (
            lambda: Curriculum(VARIANTS, index_output="steering_keyword"),
            "index_output 'steering_keyword' is the field of variant 'keyword'",
        ),
        (lambda: Curriculum(VARIANTS, schedule="linear"), "must be a Schedule, a function"),
        (lambda: Curriculum(VARIANTS, seed="1"), "curriculum seed must be an integer, got '1'"),
        (lambda: linear([1.0], [1.0], 0), "linear schedule: epochs must be >= 1, got 0"),
        (lambda: cosine([1.0], [1.0], -3), "cosine schedule: epochs must be >= 1, got -3"),
        (lambda: zero_decay(epochs=0), "zero_decay schedule: epochs must be >= 1"),
        (lambda: zero_decay(start=1.5), "start probability 1.5 is above 1"),
        (lambda: zero_decay(end=-0.1), r"end: probability -0\.1 is negative"),
        (lambda: linear([1, 0], [0.5, 0.6], 3), r"linear schedule end: probabilities sum to 1\.1"),
        (
            lambda: Curriculum(VARIANTS, schedule=linear([1, 0, 0, 0], [1, 0], 3)),
            r"linear schedule end: 2 probabilities for 4 variants",
        ),
        (
            lambda: Curriculum(VARIANTS, schedule=steps({0: [1, 0, 0, 0], 5: {"x": 1.0}})),
            r"steps schedule row 5: unknown variant 'x'",
        ),
        (lambda: steps({1: [1.0], 4: [1.0]}), "first row must start at epoch 0, not 1"),
        (lambda: steps([(0, [1.0]), (3, [1.0]), (3, [1.0])]), "duplicate start epoch 3"),
        (lambda: steps({}), "the table is empty"),
        (lambda: steps([(0.5, [1.0])]), r"row \(0\.5, \[1\.0\]\) is not \(start_epoch"),
        (lambda: Curriculum(VARIANTS).probabilities(-1), "epoch must be >= 0, got -1"),
        (lambda: Curriculum(VARIANTS).draw(["k"], -2, 0), "epoch must be >= 0, got -2"),
        (lambda: fixed([1.0]).probabilities(-1, ("a",)), "epoch must be >= 0, got -1"),
        (lambda: Curriculum(VARIANTS).draw(["k"], 1.5, 0), "epoch must be an integer, got 1.5"),
        (lambda: Curriculum(VARIANTS).draw(["k"], 0, None), "seed must be an integer, got None"),
        (
            lambda: Curriculum({"a": "fa", "b": "fb"}, schedule=zero_decay()),
            r"zero_decay schedule: no variant named 'zero'; variants: a, b",
        ),
        (
            lambda: Curriculum({"zero": None, "a": "fa"}, schedule=zero_decay({"a": 0.0})),
            "base probabilities that are all 0",
        ),
        (
            lambda: zero_decay([1.0, 0, 0, 0]).probabilities(0, NAMES),
            "base probabilities that are all 0",
        ),
        (
            lambda: Curriculum({"zero": None, "a": "fa"}, schedule=zero_decay({"b": 1.0})),
            r"zero_decay base: unknown variant 'b'; valid variants: zero, a",
        ),
        (
            lambda: Curriculum(VARIANTS, schedule=zero_decay([1, 1])),
            r"zero_decay base: 2 probabilities for 4 variants",
        ),
        (lambda: from_callable(3), "is not callable"),
    ],
)
def test_invalid_input(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


# -- output schema ------------------------------------------------------------------------------
def test_output_specs(cur: Curriculum) -> None:
    specs = cur.output_specs(_schema(), {"D": 8})
    assert specs == {
        "steering": FieldSpec(
            ext="steering_centroid.npy", encoding="npy", dtype="float32", shape=["D"], range=None
        ),
        "steering_variant": FieldSpec(
            ext="steering_variant.cls", encoding="cls", dtype="int64", shape=[], range=[0, 3]
        ),
    }
    plain = Curriculum(VARIANTS, index_output=None)
    assert list(plain.output_specs(_schema())) == ["steering"]
    # a symbolic dim and its bound value compare equal
    mixed = _schema(
        steering_keyword=FieldSpec(
            ext="steering_keyword.npy", encoding="npy", dtype="float32", shape=[8]
        )
    )
    assert cur.output_specs(mixed, {"D": 8})["steering"].shape == ["D"]
    # the output may reuse the name of one of its own variant fields
    same = Curriculum({"zero": None, "plain": "steering_centroid"}, output="steering_centroid")
    assert set(same.output_specs(_schema())) == {"steering_centroid", "steering_variant"}


@pytest.mark.parametrize(
    ("schema", "dims", "match"),
    [
        (
            {k: v for k, v in _schema().items() if k != "steering_keyword"},
            None,
            r"variant 'keyword': field 'steering_keyword' is not in the schema; schema fields: "
            r"question_emb, steering_centroid, steering_residual, cluster_id",
        ),
        (
            _schema(
                steering_residual=FieldSpec(
                    ext="steering_residual.npy", encoding="npy", dtype="float16", shape=["D"]
                )
            ),
            None,
            r"variants 'centroid' \(steering_centroid: npy float32 \['D'\]\) and 'residual' "
            r"\(steering_residual: npy float16 \['D'\]\) differ in dtype",
        ),
        (
            _schema(
                steering_keyword=FieldSpec(
                    ext="steering_keyword.npy", encoding="npy", dtype="float32", shape=[4]
                )
            ),
            {"D": 8},
            r"variants 'centroid' .* and 'keyword' .* differ in shape",
        ),
        (
            _schema(
                steering_keyword=FieldSpec(
                    ext="steering_keyword.pth", encoding="pth", dtype="float32", shape=["D"]
                )
            ),
            None,
            r"variant 'keyword': field 'steering_keyword' must be an npy array",
        ),
        (
            _schema(steering_centroid=FieldSpec(ext="steering_centroid.npy", encoding="npy")),
            None,
            r"variant 'centroid': field 'steering_centroid' must be an npy array with dtype "
            r"and shape",
        ),
        (
            _schema(),
            {"N": 3},
            r"the zero variant needs the shape of 'steering_centroid', but dims "
            r"\['D'\] are not bound",
        ),
        (
            _schema(
                steering=FieldSpec(ext="steering.npy", encoding="npy", dtype="float32", shape=["D"])
            ),
            None,
            r"output 'steering' collides with schema field 'steering', which is not one of its",
        ),
        (
            _schema(steering_variant=FieldSpec(ext="steering_variant.cls", encoding="cls")),
            None,
            r"index_output 'steering_variant' collides with schema field",
        ),
    ],
)
def test_output_specs_errors(cur: Curriculum, schema, dims, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cur.output_specs(schema, dims)


def test_output_names_are_neutral_and_the_steering_defaults_deprecated() -> None:
    """``index_output`` defaults to ``<output>_variant``; leaving ``output`` out (or the index of
    another output) keeps the ``steering``/``steering_variant`` names until 0.2.0, with a
    DeprecationWarning saying what to pass."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        named = Curriculum(VARIANTS, output="steering")
        assert (named.output, named.index_output) == ("steering", "steering_variant")
        none = Curriculum(VARIANTS, output="emb", index_output=None)
        assert (none.output, none.index_output) == ("emb", None)
        back = Curriculum.from_dict(Curriculum(VARIANTS, output="emb", index_output="i").to_dict())
        assert (back.output, back.index_output) == ("emb", "i")
    with pytest.warns(DeprecationWarning, match=r"without output=.*'steering'.*pass output=") as w:
        implicit = Curriculum(VARIANTS)
    assert w[0].filename == __file__
    assert (implicit.output, implicit.index_output) == ("steering", "steering_variant")
    with pytest.warns(DeprecationWarning, match=r"without output=") as w:
        old = Curriculum.from_dict({"variants": VARIANTS})
    assert w[0].filename == __file__  # not wdsloader's own code, where Python hides it
    assert (old.output, old.index_output) == ("steering", "steering_variant")
    with pytest.warns(DeprecationWarning, match=r"then 'emb_variant'; pass index_output=") as w:
        other = Curriculum(VARIANTS, output="emb")
    assert w[0].filename == __file__
    assert (other.output, other.index_output) == ("emb", "steering_variant")
    with pytest.warns(DeprecationWarning, match=r"then 'emb_variant'") as w:
        Curriculum.from_dict({"variants": VARIANTS, "output": "emb"})
    assert w[0].filename == __file__


def test_the_deprecation_points_at_the_user_code_through_the_loader_config() -> None:
    """A curriculum given as a dict (or read from a config file) is made inside wdsloader's
    loader set-up: the warning names the caller's line, not wdsloader's."""
    from wdsloader.stream.config import resolve_curriculum

    with pytest.warns(DeprecationWarning, match=r"without output=") as w:
        resolve_curriculum({"variants": VARIANTS}, None)  # type: ignore[arg-type]
    assert w[0].filename == __file__
