"""The factory and the data module pick collators through CollatorRegistry from a TaskSpec:
text (padding, -100 labels), vision (normalised pixel values), explicit names, a custom
registry, and errors that are never a silent fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dataset_factory import write_dataset
from tests.tokenizers_util import PAD, ids_of, tiny_tokenizer, words
from wdsloader import CollatorRegistry, TaskSpec
from wdsloader.training import DataLoaderConfig, DataLoaderFactory, UniversalDataModule

CONFIG = DataLoaderConfig(batch_size=4, shuffle=False, num_workers=0)


def test_lm_task_spec_pads_and_masks_labels():
    texts = [{"text": words(n, seed=n)} for n in (3, 7, 5, 2, 6)]
    loader = DataLoaderFactory().create_dataloader(
        texts, CONFIG, task_spec=TaskSpec.lm_tiny(), tokenizer=tiny_tokenizer()
    )
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, 7)  # padded to the longest of the batch
    assert batch["input_ids"][0, :3].tolist() == ids_of(texts[0]["text"])
    pad = batch["attention_mask"] == 0
    assert pad.sum() == (7 - 3) + 0 + (7 - 5) + (7 - 2)
    assert (batch["input_ids"][pad] == PAD).all() and (batch["labels"][pad] == -100).all()
    assert torch.equal(batch["labels"][~pad], batch["input_ids"][~pad])


def test_classification_task_spec_on_shards_with_an_hf_label_column(tmp_path):
    """IMDB/GLUE name the class column ``label``: ``cls_tiny`` over our shards gives class ids
    (B,) as ``labels``, never token-shifted LM labels of shape (B, T)."""
    from build_shards import build_shards

    rows = [{"__key__": f"r{i}", "text": words(3 + i, seed=i), "label": i % 2} for i in range(8)]
    build_shards(rows, tmp_path, splits={"train": 1.0})
    loader = DataLoaderFactory().create_dataloader(
        str(tmp_path), CONFIG, task_spec=TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer()
    )
    labels = {}
    for batch in loader:
        assert batch["labels"].shape == (4,) and "label" not in batch
        labels.update(zip(batch["__key__"], batch["labels"].tolist(), strict=True))
    assert labels == {r["__key__"]: r["label"] for r in rows}


def test_vision_task_spec_normalises():
    images = [{"pixel_values": np.full((4, 4, 3), 255, np.uint8), "labels": i} for i in range(4)]
    loader = DataLoaderFactory().create_dataloader(images, CONFIG, task_spec=TaskSpec.vision_tiny())
    batch = next(iter(loader))
    assert batch["pixel_values"].shape == (4, 3, 4, 4) and batch["labels"].dtype == torch.int64
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet, the default
    for c in range(3):
        assert torch.allclose(batch["pixel_values"][:, c], torch.tensor((1 - mean[c]) / std[c]))


def test_explicit_name_wins_and_custom_registry():
    rows = [{"x": torch.tensor([float(i)]), "name": f"s{i}"} for i in range(4)]
    config = DataLoaderConfig(batch_size=4, shuffle=False, num_workers=0, collate_fn="default")
    batch = next(iter(DataLoaderFactory().create_dataloader(rows, config, TaskSpec.vision_tiny())))
    assert batch["name"] == ["s0", "s1", "s2", "s3"] and batch["x"].shape == (4, 1)
    registry = CollatorRegistry()

    @registry.register("count", modality="audio", description="counts samples")
    def make_count(task_spec=None, scale=1):
        return Count(scale)

    audio = TaskSpec(name="speech", task_type="classification", modality="audio")
    factory = DataLoaderFactory(collator_registry=registry)
    assert next(iter(factory.create_dataloader(rows, CONFIG, audio))) == {"n": 4}
    with pytest.raises(ValueError, match="no collator registered for modality 'audio'"):
        DataLoaderFactory(CollatorRegistry()).create_dataloader(rows, CONFIG, audio)
    with pytest.raises(ValueError, match="unknown collator 'nope'"):
        DataLoaderFactory().create_dataloader(
            rows, DataLoaderConfig(collate_fn="nope", num_workers=0)
        )
    with pytest.raises(ValueError, match="the text collator needs tokenizer="):
        DataLoaderFactory().create_dataloader(rows, CONFIG, TaskSpec.lm_tiny())


class Count:
    def __init__(self, scale: int) -> None:
        self.scale = scale

    def __call__(self, samples):
        return {"n": len(samples) * self.scale}


def test_data_module_with_a_task_spec_and_shards(tmp_path):
    texts = [{"text": words(4 + i % 3, seed=i)} for i in range(10)]
    dm = UniversalDataModule(
        texts, task_spec=TaskSpec.lm_tiny(), tokenizer=tiny_tokenizer(), batch_size=4,
        val_split=0.2, num_workers=0,
    )  # fmt: skip
    val = list(dm.val_dataloader())
    assert len(val) == 1 and val[0]["input_ids"].shape[0] == 2
    root = str(tmp_path / "ds")
    write_dataset(root, {"train": [8], "val": [3]})
    config = DataLoaderConfig(batch_size=4, shuffle=False, num_workers=2, collate_fn="default")
    loader = DataLoaderFactory().create_dataloader(root, config, split="val")
    assert loader.fingerprint["collate"] == "default"  # by name: resumable states name it
    assert [b["idx"].tolist() for b in loader] == [[0, 1, 2]]
