"""Workers started by ``spawn`` and ``forkserver``: everything the dataset object holds pickles
(decoders, collators, curricula and schedules), loaders give exactly fork's batches, and an
unpicklable user callable is refused at loader creation, naming it."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

from tests.test_curriculum_loader import VARIANTS, write_curriculum_dataset
from tests.tokenizers_util import tiny_tokenizer, words
from wdsloader import Curriculum, create_loader, set_epoch
from wdsloader.collate import CausalLMCollator, CollatorRegistry, DefaultCollator
from wdsloader.curriculum import cosine, fixed, from_callable, linear, steps, zero_decay
from wdsloader.decode import SampleDecoder
from wdsloader.format import FieldSpec
from wdsloader.stream.start_method import start_method

SCHEMA = {
    "vec": FieldSpec(ext="vec.npy", encoding="npy", dtype="float32", shape=[3]),
    "emb": FieldSpec(ext="emb.npy", encoding="npy", dtype="float32", shape=["D"]),
    "label": FieldSpec(ext="label.cls", encoding="cls", dtype="int16", shape=[]),
    "meta": FieldSpec(ext="meta.json", encoding="json", dtype="json"),
    "text": FieldSpec(ext="text.txt", encoding="txt", dtype="str"),
    "arrays": FieldSpec(ext="arrays.npz", encoding="npz"),
    "obj": FieldSpec(ext="obj.pkl", encoding="pkl"),
    "weights": FieldSpec(ext="weights.pt", encoding="pt"),
    "raw": FieldSpec(ext="raw.bin", encoding="bin"),
}
SCHEDULES = {
    "fixed": fixed([0.25, 0.25, 0.25, 0.25]),
    "linear": linear({"zero": 1.0}, {"a": 0.5, "b": 0.5}, 10),
    "cosine": cosine([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], 7),
    "steps": steps({0: {"zero": 1.0}, 3: {"c": 1.0}}),
    "zero_decay": zero_decay({"a": 2.0, "b": 1.0, "c": 1.0}, start=0.6, end=0.2, epochs=5),
}


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _members() -> dict[str, bytes]:
    npz = io.BytesIO()
    np.savez(npz, a=np.arange(3))
    pt = io.BytesIO()
    torch.save(torch.ones(2), pt)
    return {
        "vec.npy": _npy(np.arange(3, dtype=np.float32)),
        "emb.npy": _npy(np.ones(5, dtype=np.float32)),
        "label.cls": b"7",
        "meta.json": b'{"i": 1}',
        "text.txt": "héllo".encode(),
        "arrays.npz": npz.getvalue(),
        "obj.pkl": pickle.dumps({"x": 1}),
        "weights.pt": pt.getvalue(),
        "raw.bin": b"\x00\x01",
    }


def _roundtrip(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray | torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and bool((a == b).all())
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_sample_decoder_and_field_decoders_pickle(allow_pickle):
    fields = None if allow_pickle else [f for f in SCHEMA if f != "obj"]
    decoder = SampleDecoder(SCHEMA, fields, allow_pickle=allow_pickle)
    copy = _roundtrip(decoder)
    raw = _members()
    expected = decoder(raw, "k1", "shard.tar")
    assert _same(copy(raw, "k1", "shard.tar"), expected)
    assert expected["label"] == np.int16(7) and type(expected["label"]) is np.int16
    for field in fields or SCHEMA:
        ext, fn = decoder.field_decoder(field)
        again = _roundtrip(fn)
        assert again == fn, field
        assert _same(again(memoryview(raw[ext])), expected[field]), field
    # the schema checks travel with the decoder
    bad = dict(raw, **{"vec.npy": _npy(np.arange(4, dtype=np.float32))})
    with pytest.raises(Exception, match=r"shape \[4\], schema says \[3\]"):
        copy(bad, "k1", "shard.tar")


def test_every_registered_collator_pickles():
    rows = [{"__key__": f"k{i}", "tokens": np.arange(i, i + 4), "x": float(i)} for i in range(3)]
    images = [{"pixel_values": np.full((8, 8, 3), i, np.uint8), "labels": i} for i in range(3)]
    texts = [{"__key__": f"k{i}", "text": words(3 + i, seed=i)} for i in range(3)]
    docs = [{"input_ids": np.arange(3 + i)} for i in range(3)]
    cases = {  # name -> (options, samples): every registered collator needs a case
        "default": ({}, rows),
        "causal_lm": ({}, rows),
        "vision": ({}, images),
        "text": ({"tokenizer": tiny_tokenizer()}, texts),
        "packed": ({"max_tokens": 8}, docs),
    }
    registry = CollatorRegistry.get_instance()
    assert {i.name for i in registry.list_collators()} == set(cases)
    for name, (options, samples) in cases.items():
        collate = registry.get_collator(collator_name=name, **options)
        copy = _roundtrip(collate)
        assert type(copy) is type(collate) and repr(copy) == repr(collate), name
        assert _same(copy(samples), collate(samples)), name
    padded = CausalLMCollator(pad_id=0)
    assert _roundtrip(padded) == padded and _roundtrip(padded) != CausalLMCollator()
    columns = {"__key__": ["a", "b"], "v": np.ones((2, 3), np.float32), "m": [{}, {}]}
    default = DefaultCollator(stack=["v"])
    assert _roundtrip(default) == default != DefaultCollator()
    assert _same(_roundtrip(default).collate_columns(columns), default.collate_columns(columns))


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_every_schedule_kind_and_its_curriculum_pickle(kind):
    schedule = SCHEDULES[kind]
    assert _roundtrip(schedule) == schedule
    curriculum = Curriculum(VARIANTS, schedule=schedule, seed=3)
    copy = _roundtrip(curriculum)
    assert copy.to_dict() == curriculum.to_dict()
    keys = [f"k{i}" for i in range(200)]
    for epoch in (0, 4, 20):
        assert np.array_equal(copy.draw(keys, epoch, 0), curriculum.draw(keys, epoch, 0))


@pytest.mark.parametrize("gather", [True, False])
def test_loader_dataset_object_round_trips(tmp_path, gather):
    root = write_curriculum_dataset(tmp_path / "ds", [20, 13], Curriculum(VARIANTS, seed=1))
    loader = create_loader(root, "train", batch_size=8, drop_last=False, gather=gather)
    ds = loader.dataset_obj
    copy = _roundtrip(ds)
    assert copy.collate_fn == ds.collate_fn == DefaultCollator()
    assert copy.curriculum.to_dict() == ds.curriculum.to_dict()
    batches, again = list(ds), list(copy)
    assert len(batches) == 5
    for b, c in zip(batches, again, strict=True):
        assert _same(b, c)


def _epochs(loader, n: int = 2) -> list[list[dict]]:
    out = []
    for epoch in range(n):
        set_epoch(loader, epoch * 40)  # epoch 40: another curriculum mix and shuffle order
        out.append(list(loader))
    return out


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_two_workers_give_forks_batches(tmp_path_factory, method):
    root = write_curriculum_dataset(
        tmp_path_factory.mktemp("sm") / "ds", [23, 17, 30], Curriculum(VARIANTS, seed=5)
    )
    opts = {
        "batch_size": 8,
        "num_workers": 2,
        "drop_last": False,
        "collate_fn": "default",  # a registry collator, by name
        "persistent_workers": True,  # set_epoch must reach them through shared memory
    }
    reference = _epochs(create_loader(root, "train", multiprocessing_context="fork", **opts))
    loader = create_loader(root, "train", multiprocessing_context=method, **opts)
    got = _epochs(loader)
    for epoch, (want, have) in enumerate(zip(reference, got, strict=True)):
        keys = [k for b in have for k in b["__key__"]]
        assert len(keys) == 70 and len(set(keys)) == 70, epoch
        assert len(have) == len(want) == len(loader)
        for b, c in zip(want, have, strict=True):
            assert set(b) == {
                "__key__",
                "__index__",
                "vec",
                "idx",
                "meta",
                "steering",
                "steering_variant",
            }
            assert _same(b, c)
    # the second epoch was played: another order in the persistent workers
    assert [b["__key__"] for b in got[0]] != [b["__key__"] for b in got[1]]
    assert loader.stats["samples"] == 140


def _make_weights(epoch: int) -> list[float]:
    return [0.25, 0.25, 0.25, 0.25]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_callables_are_refused_at_creation(tmp_path, method):
    root = write_curriculum_dataset(tmp_path / "ds", [10])
    opts = {"batch_size": 4, "num_workers": 2, "multiprocessing_context": method}
    lambda_schedule = Curriculum(VARIANTS, schedule=from_callable(lambda e: [0.25] * 4))
    with pytest.raises(ValueError, match=rf"the curriculum \(its schedule\) cannot be sent to "
                       rf"DataLoader workers started by '{method}' .*lambda"):  # fmt: skip
        create_loader(root, "train", curriculum=lambda_schedule, **opts)
    with pytest.raises(ValueError, match=r"the collate_fn cannot be sent .*local object"):
        create_loader(root, "train", collate_fn=_local_collator(), **opts)
    # a module-level function is fine, and so is anything under fork
    ok = Curriculum(VARIANTS, schedule=from_callable(_make_weights))
    create_loader(root, "train", curriculum=ok, **opts)
    create_loader(
        root, "train", batch_size=4, num_workers=2, multiprocessing_context="fork",
        curriculum=lambda_schedule, collate_fn=_local_collator(),
    )  # fmt: skip


def _local_collator():
    def collate(samples):
        return samples

    return collate


def test_start_method_resolution():
    import multiprocessing

    assert start_method("spawn") == "spawn"
    assert start_method(multiprocessing.get_context("forkserver")) == "forkserver"
    assert start_method(None) in multiprocessing.get_all_start_methods()
