"""The ``packed`` collator: documents -> rows of max_tokens with per-document positions,
document ids, cu_seqlens and labels that never cross a document boundary."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from wdsloader.collate import CollatorRegistry, PackedCollator
from wdsloader.plan.packing import DocumentTooLongError, Packing


def _docs(*lengths: int) -> list[dict]:
    return [
        {"__key__": f"d{i}", "input_ids": np.arange(100 * i + 1, 100 * i + 1 + n)}
        for i, n in enumerate(lengths)
    ]


def test_hand_made_rows():
    # 6 -> row A (room 4), 5 -> row B (room 5), 4 -> A, 3 -> B; rows by first document
    batch = PackedCollator(max_tokens=10)(_docs(3, 6, 5, 4))
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 201, 202, 203, 204, 205, 0, 0],
        [101, 102, 103, 104, 105, 106, 301, 302, 303, 304],
    ]
    assert batch["position_ids"].tolist() == [
        [0, 1, 2, 0, 1, 2, 3, 4, 0, 0],
        [0, 1, 2, 3, 4, 5, 0, 1, 2, 3],
    ]
    assert batch["document_ids"].tolist() == [
        [0, 0, 0, 2, 2, 2, 2, 2, -1, -1],
        [1, 1, 1, 1, 1, 1, 3, 3, 3, 3],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 8 + [0, 0], [1] * 10]
    assert batch["labels"].tolist() == [
        [-100, 2, 3, -100, 202, 203, 204, 205, -100, -100],
        [-100, 102, 103, 104, 105, 106, -100, 302, 303, 304],
    ]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 10, 16, 20]
    assert batch["max_seqlen"] == 6
    assert batch["__key__"] == [["d0", "d2"], ["d1", "d3"]]
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64


def test_a_long_document_is_split_into_pieces_each_its_own_sequence():
    batch = PackedCollator(max_tokens=4, labels=False)(_docs(10, 2))
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10, 101, 102],
    ]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3]] * 2 + [[0, 1, 0, 1]]
    assert batch["cu_seqlens"].tolist() == [0, 4, 8, 10, 12]
    assert "labels" not in batch
    with pytest.raises(DocumentTooLongError, match="document 0 has 10 tokens"):
        PackedCollator(max_tokens=4, too_long="error")(_docs(10, 2))


def test_every_token_once_on_random_documents():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 70, 200).tolist()
    samples = _docs(*lengths)
    batch = PackedCollator(max_tokens=64, window=50)(samples)
    ids, doc = batch["input_ids"].numpy(), batch["document_ids"].numpy()
    for i, s in enumerate(samples):
        assert sorted(ids[doc == i].tolist()) == s["input_ids"].tolist()
    assert int(batch["attention_mask"].sum()) == sum(lengths)
    cu = batch["cu_seqlens"].numpy()
    assert cu[-1] == ids.size and (np.diff(cu) > 0).all()
    # a label is never the first token of a sequence, nor padding
    first = np.zeros(ids.size, bool)
    first[cu[:-1]] = True
    labels = batch["labels"].numpy().reshape(-1)
    assert (labels[first] == -100).all()
    assert ((labels != -100) == (~first & (doc.reshape(-1) >= 0))).all()


def test_registry_options_and_errors():
    collate = CollatorRegistry.get_instance().get_collator(
        collator_name="packed", max_tokens=8, pad_id=-1
    )
    assert isinstance(collate, PackedCollator)
    assert pickle.loads(pickle.dumps(collate)) == collate
    assert collate(_docs(3))["input_ids"].tolist() == [[1, 2, 3, -1, -1, -1, -1, -1]]
    packing = Packing(max_tokens=16, field="tokens", window=4, too_long="error")
    made = PackedCollator.from_packing(packing, labels=False)
    assert (made.max_tokens, made.field, made.window, made.too_long) == (16, "tokens", 4, "error")
    with pytest.raises(ValueError, match="packed: sample 'd0' has no field 'tokens'"):
        made(_docs(3))
    with pytest.raises(ValueError, match="Packing.max_tokens must be a positive int, got 0"):
        PackedCollator(max_tokens=0)
    with pytest.raises(ValueError, match="Packing.too_long must be one of"):
        Packing(max_tokens=4, too_long="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="packed: cannot collate an empty batch"):
        PackedCollator(max_tokens=4)([])
