"""Collators from the registry inside loaders: ``create_loader(collate_fn="text")`` on built
shards, and registered collators shipped to ``spawn`` workers (they must pickle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from build_shards import build_shards
from tests.tokenizers_util import PAD, ids_of, tiny_hf_tokenizer, tiny_tokenizer, words
from wdsloader import CollatorRegistry, TaskSpec, create_loader

N = 22


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("text") / "ds"
    docs = [
        {"__key__": f"d{i:03d}", "text": words(2 + i % 9, seed=i), "label": i % 3} for i in range(N)
    ]
    build_shards(docs, root, shard_max_count=5)
    return root, {d["__key__"]: d for d in docs}


def _rows_by_key(loader) -> dict[str, tuple[list[int], int]]:
    """key -> (its unpadded token ids, its label), checking every batch's padding on the way."""
    out = {}
    for batch in loader:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert ids.shape == mask.shape == labels.shape and ids.shape[1] % 4 == 0
        assert torch.equal(labels == -100, mask == 0) and bool((ids[mask == 0] == PAD).all())
        for i, key in enumerate(batch["__key__"]):
            out[key] = (ids[i][mask[i] == 1].tolist(), int(batch["label"][i]))
    return out


def test_create_loader_text_by_name(text_shards):
    root, docs = text_shards
    loader = create_loader(
        root, "train", batch_size=4, collate_fn="text",
        collate_options={"tokenizer": tiny_hf_tokenizer(), "pad_to_multiple_of": 4},
    )  # fmt: skip
    rows = _rows_by_key(loader)
    assert len(rows) == 20  # train drops the last partial batch
    for key, (ids, label) in rows.items():
        assert ids == ids_of(docs[key]["text"]) and label == docs[key]["label"]


def test_create_loader_text_in_spawn_workers(text_shards):
    root, docs = text_shards
    options = {"tokenizer": tiny_tokenizer(), "pad_to_multiple_of": 4}
    loader = create_loader(
        root, "train", batch_size=4, drop_last=False, collate_fn="text", collate_options=options,
        num_workers=1, multiprocessing_context="spawn",
    )  # fmt: skip
    rows = _rows_by_key(loader)
    assert sorted(rows) == sorted(docs)  # drop_last=False keeps every sample
    assert all(ids == ids_of(docs[k]["text"]) for k, (ids, _) in rows.items())


def test_create_loader_collate_errors(text_shards):
    root, _ = text_shards
    with pytest.raises(
        ValueError, match=r"unknown collator 'txt'; registered: default \(any\), text"
    ):
        create_loader(root, "train", batch_size=4, collate_fn="txt")
    with pytest.raises(ValueError, match=r"text: the text collator needs tokenizer="):
        create_loader(root, "train", batch_size=4, collate_fn="text")
    with pytest.raises(
        ValueError,
        match=r"collate_options=\['tokenizer'\] would be unused: collate_fn is a callable",
    ):
        create_loader(root, "train", batch_size=4, collate_fn=len, collate_options={"tokenizer": 1})


class Keys:
    """A user collator (module level: picklable): the batch's keys, prefixed."""

    def __init__(self, task_spec=None, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, samples):
        return [self.prefix + s["__key__"] for s in samples]


def test_create_loader_uses_the_one_registry(text_shards):
    root, docs = text_shards
    registry = CollatorRegistry.get_instance()
    registry.register("keys", modality="text")(Keys)
    try:
        loader = create_loader(
            root, "train", batch_size=4, drop_last=False, collate_fn="keys",
            collate_options={"prefix": "x-"},
        )  # fmt: skip
        got = [k for batch in loader for k in batch]
    finally:
        CollatorRegistry.reset()
    assert sorted(got) == sorted(f"x-{k}" for k in docs)


class Images(torch.utils.data.Dataset):
    """Map-style uint8 HWC images with a class label (module level: spawn workers import it)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": np.full((6, 6, 3), i * 20, np.uint8), "labels": i % 4}


def test_registered_collators_reach_spawn_workers():
    registry = CollatorRegistry.get_instance()
    collate = registry.get_collator(TaskSpec.vision_tiny())
    loader = DataLoader(
        Images(), batch_size=4, collate_fn=collate, num_workers=1, multiprocessing_context="spawn"
    )
    batches = list(loader)
    expected = [collate([Images()[i] for i in range(b, b + 4)]) for b in (0, 4, 8)]
    assert len(batches) == 3
    for got, want in zip(batches, expected, strict=True):
        assert torch.equal(got["pixel_values"], want["pixel_values"])
        assert got["labels"].tolist() == want["labels"].tolist()
    # pixel (i * 20) / 255 normalised with ImageNet's channel-0 statistics
    assert np.isclose(batches[1]["pixel_values"][0, 0, 0, 0].item(), (80 / 255 - 0.485) / 0.229)


def test_a_float_beyond_float32_is_an_error_or_float64_in_every_batch(tmp_path):
    """1e300 is a valid JSON float the builder accepts: the default collator never turns it
    into inf; ``collate_options={"float64": [...]}`` keeps the field float64 in every batch."""
    rows = [{"__key__": f"k{i}", "y": 1e300 if i == 5 else i / 4} for i in range(8)]
    build_shards(rows, tmp_path, splits={"train": 1.0})
    with pytest.raises(ValueError, match=r"field 'y' of sample 'k5' holds 1e\+300, which float32"):
        list(create_loader(tmp_path, "train", batch_size=4, shuffle=False))
    loader = create_loader(
        tmp_path, "train", batch_size=4, shuffle=False, collate_options={"float64": ["y"]}
    )
    batches = list(loader)
    assert [b["y"].dtype for b in batches] == [torch.float64, torch.float64]
    assert torch.cat([b["y"] for b in batches]).tolist() == [r["y"] for r in rows]
