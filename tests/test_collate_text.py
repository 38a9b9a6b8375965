"""The ``text`` collator: tokenizing, dynamic padding, attention masks, causal and masked LM
labels, the samples' own labels, options from a TaskSpec, and every error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tokenizers_util import (
    BOS,
    EOS,
    MASK,
    PAD,
    ids_of,
    tiny_hf_tokenizer,
    tiny_tokenizer,
    words,
)
from wdsloader.collate import CollatorRegistry, TaskSpec, TextCollator


def text(**kwargs):
    return CollatorRegistry.get_instance().get_collator(collator_name="text", **kwargs)


TEXTS = [words(3, seed=1), words(7, seed=2), words(5, seed=3)]
LENGTHS = [3, 7, 5]


def _expected_rows(texts, bos_eos: bool) -> list[list[int]]:
    return [([BOS] if bos_eos else []) + ids_of(t) + ([EOS] if bos_eos else []) for t in texts]


def _check_padded(batch, rows, width, left=False):
    """input_ids hold each row then padding; attention_mask and -100 labels mark the padding."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape == (len(rows), width)
    assert ids.dtype == mask.dtype == labels.dtype == torch.int64
    for i, row in enumerate(rows):
        pad = [PAD] * (width - len(row))
        assert ids[i].tolist() == (pad + row if left else row + pad)
        ones = [1] * len(row)
        assert mask[i].tolist() == ([0] * len(pad) + ones if left else ones + [0] * len(pad))
    assert torch.equal(labels == -100, mask == 0)
    assert torch.equal(labels[mask == 1], ids[mask == 1])


@pytest.mark.parametrize("make", [tiny_tokenizer, tiny_hf_tokenizer])
@pytest.mark.parametrize("template", [False, True])
def test_causal_lm_from_text_pads_to_the_longest(make, template):
    samples = [{"__key__": f"k{i}", "text": t} for i, t in enumerate(TEXTS)]
    batch = text(tokenizer=make(template=template))(samples)
    rows = _expected_rows(TEXTS, template)
    _check_padded(batch, rows, max(map(len, rows)))
    assert batch["__key__"] == ["k0", "k1", "k2"]
    assert set(batch) == {"input_ids", "attention_mask", "labels", "__key__"}


def test_token_ids_as_lists_arrays_and_tensors_give_the_same_batch():
    rows = _expected_rows(TEXTS, False)
    as_text = text(tokenizer=tiny_tokenizer())([{"text": t} for t in TEXTS])
    for kind in (list, np.array, torch.tensor):
        batch = text(tokenizer=tiny_tokenizer())([{"input_ids": kind(r)} for r in rows])
        for name in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(batch[name], as_text[name]), (kind, name)
    # add_special_tokens applies to text only: given ids are taken as they are
    with_template = text(tokenizer=tiny_tokenizer(template=True))
    assert torch.equal(
        with_template([{"input_ids": r} for r in rows])["input_ids"], as_text["input_ids"]
    )


@pytest.mark.parametrize(("multiple", "width"), [(4, 8), (8, 8), (7, 7), (1, 7)])
def test_pad_to_multiple_of(multiple, width):
    batch = text(tokenizer=tiny_hf_tokenizer(), pad_to_multiple_of=multiple)(
        [{"text": t} for t in TEXTS]
    )
    _check_padded(batch, _expected_rows(TEXTS, False), width)


def test_max_length_cuts_then_pads_and_left_padding():
    batch = text(tokenizer=tiny_tokenizer(), max_length=4)([{"text": t} for t in TEXTS])
    rows = [r[:4] for r in _expected_rows(TEXTS, False)]
    _check_padded(batch, rows, 4)
    left = text(tokenizer=tiny_hf_tokenizer(padding_side="left"))([{"text": t} for t in TEXTS])
    _check_padded(left, _expected_rows(TEXTS, False), 7, left=True)
    forced = text(tokenizer=tiny_hf_tokenizer(padding_side="left"), padding_side="right")
    assert forced.padding_side == "right"


def test_padding_the_tokenizer_itself_adds_is_dropped():
    tok = tiny_tokenizer()
    tok.enable_padding(pad_id=PAD, pad_token="[PAD]", length=12)
    batch = text(tokenizer=tok)([{"text": t} for t in TEXTS])
    _check_padded(batch, _expected_rows(TEXTS, False), 7)


@pytest.mark.parametrize("make", [tiny_tokenizer, tiny_hf_tokenizer])
def test_mlm_masks_only_real_non_special_tokens(make):
    torch.manual_seed(0)
    texts = [words(20 + i % 30, seed=i) for i in range(64)]
    collate = text(tokenizer=make(template=True), mlm=True)
    batch = collate([{"text": t} for t in texts])
    rows = _expected_rows(texts, True)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    width = max(map(len, rows))
    assert ids.shape == mask.shape == labels.shape == (64, width)
    original = torch.full((64, width), PAD)
    for i, r in enumerate(rows):
        original[i, : len(r)] = torch.tensor(r)
    assert torch.equal(mask, (torch.arange(width) < torch.tensor([[len(r)] for r in rows])).long())
    chosen = labels != -100
    assert torch.equal(labels[chosen], original[chosen])  # labels hold the original token
    assert not chosen[mask == 0].any() and torch.equal(ids[mask == 0], original[mask == 0])
    special = (original == BOS) | (original == EOS)
    assert not chosen[special].any() and torch.equal(ids[special], original[special])
    assert torch.equal(ids[~chosen], original[~chosen])  # unchosen tokens are untouched
    words_total = int((mask.bool() & ~special).sum())
    assert 0.12 < chosen.sum().item() / words_total < 0.18  # mlm_probability 0.15
    masked = (ids == MASK)[chosen].float().mean().item()
    assert 0.7 < masked < 0.9  # 80% of the chosen tokens become [MASK]


def test_mlm_probability_from_the_task_spec_and_errors():
    spec = TaskSpec.lm_tiny()
    spec.preprocessing_config.update(mlm=True, mlm_probability=1.0)
    torch.manual_seed(0)
    batch = CollatorRegistry.get_instance().get_collator(spec, tokenizer=tiny_tokenizer())(
        [{"text": t} for t in TEXTS]
    )
    assert torch.equal(batch["labels"] != -100, batch["attention_mask"] == 1)
    from tokenizers import Tokenizer, models

    no_mask = Tokenizer(models.WordLevel(vocab={"[PAD]": 0, "a": 1}, unk_token="[PAD]"))
    with pytest.raises(ValueError, match=r"mlm=True needs a mask token; the tokenizer has none"):
        text(tokenizer=no_mask, mlm=True)
    hf = tiny_hf_tokenizer()
    hf.mask_token = None
    with pytest.raises(ValueError, match="mlm=True needs a tokenizer with a mask token"):
        text(tokenizer=hf, mlm=True)
    with pytest.raises(
        ValueError, match="mlm=True makes the labels, but the samples carry 'labels'"
    ):
        text(tokenizer=tiny_tokenizer(), mlm=True)([{"text": "w1", "labels": 1}])


def test_samples_labels_classes_and_sequences():
    cls_ = CollatorRegistry.get_instance().get_collator(
        TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer()
    )
    batch = cls_([{"text": t, "labels": i % 2, "score": 0.5} for i, t in enumerate(TEXTS)])
    assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == [0, 1, 0]
    assert batch["score"].dtype == torch.float32  # other fields: the default collator
    s2s = CollatorRegistry.get_instance().get_collator(
        TaskSpec.seq2seq_tiny(), tokenizer=tiny_tokenizer(), pad_to_multiple_of=4
    )
    batch = s2s([{"text": "w1 w2", "labels": [7, 8, 9]}, {"text": "w3", "labels": np.array([5])}])
    assert batch["labels"].tolist() == [[7, 8, 9, -100], [5, -100, -100, -100]]
    assert batch["input_ids"].tolist() == [[6, 7, PAD, PAD], [8, PAD, PAD, PAD]]
    own = text(tokenizer=tiny_tokenizer(), label_field="target")
    assert own([{"text": "w1", "target": 3}])["labels"].tolist() == [3]


def test_pad_id_sources():
    from tokenizers import Tokenizer, models, pre_tokenizers

    no_pad = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    no_pad.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with pytest.raises(ValueError, match=r"the tokenizer has no pad token; pass pad_token_id="):
        text(tokenizer=no_pad)
    assert text(tokenizer=no_pad, pad_token_id=2)([{"text": "a"}, {"text": "a a"}])[
        "input_ids"
    ].tolist() == [[1, 2], [1, 1]]
    spec = TaskSpec.lm_tiny()
    spec.special_tokens = {"pad_token_id": 0}
    assert TextCollator(spec, tokenizer=no_pad).pad_id == 0
    hf = tiny_hf_tokenizer()
    assert TextCollator(tokenizer=hf).pad_id == hf.pad_token_id == PAD
    assert TextCollator(tokenizer=hf, pad_token_id=3).pad_id == 3


def test_errors_name_the_sample_and_field():
    with pytest.raises(ValueError, match=r"text collator needs tokenizer="):
        text()
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer or a "):
        text(tokenizer="gpt2")
    c = text(tokenizer=tiny_tokenizer())
    with pytest.raises(ValueError, match="field 'text' of sample 'b' must be a str, got a bytes"):
        c([{"__key__": "a", "text": "w1"}, {"__key__": "b", "text": b"w2"}])
    with pytest.raises(
        ValueError, match=r"sample 'a' has neither 'text' \(text\) nor 'input_ids' \(token ids\)"
    ):
        c([{"__key__": "a", "body": "w1"}])
    with pytest.raises(ValueError, match=r"field 'input_ids' of sample #1 must be a 1-D sequence"):
        c([{"input_ids": [1, 2]}, {"input_ids": [[1, 2]]}])
    with pytest.raises(ValueError, match=r"text: cannot collate an empty batch"):
        c([])
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive int, got 0"):
        text(tokenizer=tiny_tokenizer(), pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', got 'up'"):
        text(tokenizer=tiny_tokenizer(), padding_side="up")


@pytest.mark.parametrize("make", [tiny_tokenizer, tiny_hf_tokenizer])
def test_collators_pickle_and_mask_alike(make):
    import pickle

    samples = [{"text": words(30, seed=i)} for i in range(4)]
    for options in ({}, {"mlm": True}):
        collate = text(tokenizer=make(), **options)
        copy = pickle.loads(pickle.dumps(collate))
        torch.manual_seed(5)
        a = collate(samples)
        torch.manual_seed(5)
        b = copy(samples)
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "attention_mask", "labels"))
        assert repr(copy) == repr(collate)


@pytest.mark.parametrize("column", ["label", "labels"])
def test_classification_takes_class_ids_from_label_or_labels_never_lm_labels(column):
    """The Hugging Face convention (IMDB, GLUE) names the class column ``label``: a
    classification task gives its class ids as ``labels`` (B,), and never token-shifted labels."""
    cls_ = CollatorRegistry.get_instance().get_collator(
        TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer()
    )
    batch = cls_([{"__key__": f"k{i}", "text": t, column: i % 2} for i, t in enumerate(TEXTS)])
    assert batch["labels"].shape == (3,) and batch["labels"].dtype == torch.int64
    assert batch["labels"].tolist() == [0, 1, 0]
    assert sorted(batch) == ["__key__", "attention_mask", "input_ids", "labels"]


def test_classification_uses_the_declared_field_and_raises_naming_the_fields():
    spec = TaskSpec(name="sentiment", task_type="text_classification", target_field="stars")
    c = TextCollator(spec, tokenizer=tiny_tokenizer())
    batch = c([{"text": "w1", "stars": 4, "label": 9}, {"text": "w2", "stars": 2, "label": 9}])
    assert batch["labels"].tolist() == [4, 2] and batch["label"].tolist() == [9, 9]
    cls_ = TextCollator(TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer())
    with pytest.raises(
        ValueError,
        match=r"text: task 'cls_tiny' is a classification task \(task_type 'classification'\): "
        r"its class ids come from one of the fields \['labels', 'label'\], but sample 'a' has "
        r"only \['__key__', 'text'\]; name the field with label_field=",
    ):
        cls_([{"__key__": "a", "text": "w1"}])
    named = TextCollator(TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer(), label_field="y")
    with pytest.raises(ValueError, match=r"one of the fields \['y'\], but sample #0 has only"):
        named([{"text": "w1", "label": 1}])
    with pytest.raises(
        ValueError,
        match=r"text: field 'label' of sample 'b' must hold an integer class id or a multi-label "
        r"vector of one length \(classification task 'cls_tiny'\), got a str",
    ):
        cls_(
            [
                {"__key__": "a", "text": "w1", "label": 1},
                {"__key__": "b", "text": "w", "label": "pos"},
            ]
        )
    with pytest.raises(ValueError, match=r"mlm=True makes token labels, but task 'cls_tiny' is"):
        TextCollator(TaskSpec.cls_tiny(), tokenizer=tiny_tokenizer(), mlm=True)


def test_optional_fields_stay_lists_and_the_loader_passes_them_where_accepted():
    """The text collator passed its other fields through a plain DefaultCollator: an optional
    field was a tensor in a batch where every sample had it (a list where one lacked it)."""
    samples = [{"__key__": f"k{i}", "text": t, "score": i / 2} for i, t in enumerate(TEXTS)]
    batch = text(tokenizer=tiny_tokenizer(), optional=["score"])(samples)
    assert batch["score"] == [0.0, 0.5, 1.0] and batch["input_ids"].shape[0] == 3
    assert isinstance(text(tokenizer=tiny_tokenizer())(samples)["score"], torch.Tensor)
    registry = CollatorRegistry()
    assert all(registry.accepts(name, "optional") for name in ("default", "text", "vision"))
    assert not registry.accepts("causal_lm", "optional") and not registry.accepts("x", "optional")

    @registry.register("passes_on", modality="any")
    def passes_on(task_spec=None, **kwargs):  # may hand kwargs to something that refuses them
        return list

    assert not registry.accepts("passes_on", "optional")
