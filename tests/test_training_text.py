"""create_dataloaders (seed 003): JSONL/plain text -> cached token shards -> causal-LM batches.

Checks the shapes and the shift, the exact token stream (separators, windows), train shuffled
with drop_last and val in order with its partial batch, the cache hit (nothing built) and miss
(changed input, tokenizer or option), the tokenizer kinds (tokenizers, transformers, an
``encode`` returning a dict: seed 003's "Bug 1001"), file:line errors and workers."""

from __future__ import annotations

import json
import os
import re
import shutil

import fsspec
import pytest
import torch

import build_shards.text as text_builder
from build_shards.errors import BuildError
from tests.tokenizers_util import BOS, EOS, ids_of, tiny_hf_tokenizer, tiny_tokenizer, words
from wdsloader.format import Manifest
from wdsloader.format.lengths import read_split_lengths
from wdsloader.training import create_dataloaders

SEQ = 8


def write_corpus(tmp_path, n_train: int = 40, n_val: int = 7):
    train = tmp_path / "train.jsonl"
    train_docs = [words(5 + i % 9, seed=i) for i in range(n_train)]
    train.write_text(
        "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(train_docs))
    )
    val = tmp_path / "val.txt"
    val_docs = [words(4 + i % 5, seed=1000 + i) for i in range(n_val)]
    val.write_text("\n\n".join(d.replace(" ", " \n", 1) for d in val_docs) + "\n")
    return train, val, train_docs, val_docs


def chunks(docs, bos=BOS, eos=EOS, stride=SEQ):
    stream = []
    for d in docs:
        stream += (
            ([bos] if bos is not None else []) + ids_of(d) + ([eos] if eos is not None else [])
        )
    return [stream[i : i + SEQ + 1] for i in range(0, len(stream) - SEQ, stride)]


def rows(loader):
    out = []
    for b in loader:
        assert torch.equal(b["input_ids"][:, 1:], b["labels"][:, :-1])
        assert b["input_ids"].shape == b["labels"].shape and b["input_ids"].shape[1] == SEQ
        out += [
            x + [y[-1]] for x, y in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True)
        ]
    return out


@pytest.fixture()
def corpus(tmp_path):
    return write_corpus(tmp_path)


def test_batches_windows_and_order(corpus, tmp_path):
    train_path, val_path, train_docs, val_docs = corpus
    train, val = create_dataloaders(
        train_path,
        val_path,
        tiny_tokenizer(),
        batch_size=4,
        seq_length=SEQ,
        cache_dir=tmp_path / "c",
    )
    expected_train, expected_val = chunks(train_docs), chunks(val_docs)
    got_val = rows(val)
    assert got_val == expected_val  # in order, every window, the last partial batch kept
    assert len(val) == -(-len(expected_val) // 4) and len(expected_val) % 4 != 0
    assert all(b["input_ids"].shape == (4, SEQ) for b in train)
    got_train = rows(train)
    assert len(got_train) == len(expected_train) // 4 * 4  # drop_last
    assert got_train != expected_train[: len(got_train)]  # shuffled
    assert {tuple(r) for r in got_train} <= {tuple(r) for r in expected_train}
    # the token shards record every window's length (token-weighted mixing reads them)
    manifests = sorted((tmp_path / "c").rglob("manifest.json"))
    assert len(manifests) == 2
    for path in manifests:
        m = Manifest.load(str(path.parent))
        assert m.build["lengths_field"] == "tokens"
        for split in m.splits.values():
            lengths = read_split_lengths(fsspec.filesystem("file"), str(path.parent), split.shards)
            assert lengths.tolist() == [SEQ + 1] * split.num_samples


def test_cache_hit_builds_nothing_and_changes_rebuild(corpus, tmp_path, monkeypatch):
    train_path, val_path, _, _ = corpus
    cache = tmp_path / "cache"
    calls = []
    real = text_builder.build_text_shards

    def counting(paths, output, *args, **kwargs):
        calls.append(os.path.basename(str(output)))
        return real(paths, output, *args, **kwargs)

    monkeypatch.setattr(text_builder, "build_text_shards", counting)
    tok = tiny_tokenizer()
    first_train, first_val = create_dataloaders(train_path, val_path, tok, 4, SEQ, cache_dir=cache)
    assert len(calls) == 2 and sorted(c.split("-")[0] for c in calls) == ["train", "val"]
    stamps = {p: os.stat(cache / p / "manifest.json") for p in os.listdir(cache)}
    again_train, again_val = create_dataloaders(train_path, val_path, tok, 4, SEQ, cache_dir=cache)
    assert len(calls) == 2  # nothing built
    for p, st in stamps.items():
        now = os.stat(cache / p / "manifest.json")
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert rows(again_val) == rows(first_val)
    # a changed input rebuilds that file's shards only
    with open(train_path, "a") as f:
        f.write(json.dumps({"text": "w1 w2 w3"}) + "\n")
    create_dataloaders(train_path, val_path, tok, 4, SEQ, cache_dir=cache)
    assert len(calls) == 3 and calls[-1].startswith("train-")
    # another tokenizer (same vocabulary, another template) or option rebuilds too
    create_dataloaders(train_path, None, tiny_tokenizer(template=True), 4, SEQ, cache_dir=cache)
    create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache, stride=4)
    assert len(calls) == 5 and len(os.listdir(cache)) == 5


def test_tokenizer_kinds_give_the_same_tokens(corpus, tmp_path):
    train_path, val_path, _, val_docs = corpus
    pytest.importorskip("transformers")
    _, hf_val = create_dataloaders(
        train_path, val_path, tiny_hf_tokenizer(), 4, SEQ, cache_dir=tmp_path / "c"
    )
    assert rows(hf_val) == chunks(val_docs)


class DictEncoder:
    """Seed 003's tokenizer: ``encode`` returns a dict (input_ids, attention_mask)."""

    def encode(self, text):
        ids = ids_of(text)
        return {
            "input_ids": ids,
            "token_type_ids": [0] * len(ids),
            "attention_mask": [1] * len(ids),
        }


class ListEncoder:
    def encode(self, text):
        return [BOS, *ids_of(text), EOS]


def test_encode_returning_a_dict_or_ids(corpus, tmp_path):
    train_path, val_path, _, val_docs = corpus
    _, val = create_dataloaders(
        train_path, val_path, DictEncoder(), 4, SEQ, cache_dir=tmp_path / "c"
    )
    assert rows(val) == chunks(val_docs, bos=None, eos=None)  # its ids as they come
    _, val = create_dataloaders(
        train_path, val_path, ListEncoder(), 4, SEQ, cache_dir=tmp_path / "c"
    )
    assert rows(val) == chunks(val_docs)
    with pytest.raises(TypeError, match="an object with encode"):
        create_dataloaders(train_path, val_path, object(), cache_dir=tmp_path / "c")


def test_jsonl_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = "".join(json.dumps({"text": words(20, seed=i)}) + "\n" for i in range(6))
    bad.write_text(good + '{"body": "w4"}\n')  # line 7: past the documents the cache key reads
    with pytest.raises(BuildError, match=rf"{bad}:7: no field 'text'"):
        create_dataloaders(bad, None, tiny_tokenizer(), seq_length=4, cache_dir=tmp_path / "c")
    assert not list((tmp_path / "c").glob("*/manifest.json"))  # nothing cached
    bad.write_text('{"text": "w1 w2"}\nnot json\n')
    with pytest.raises(BuildError, match=rf"{bad}:2: invalid JSON"):
        create_dataloaders(bad, None, tiny_tokenizer(), cache_dir=tmp_path / "c")


def test_workers_with_the_default_start_method(corpus, tmp_path):
    train_path, val_path, _, val_docs = corpus
    train, val = create_dataloaders(
        train_path, val_path, tiny_tokenizer(), 4, SEQ, num_workers=2, cache_dir=tmp_path / "c"
    )
    assert train.num_workers == 2 and val.num_workers == 2
    assert rows(val) == chunks(val_docs)
    train0, _ = create_dataloaders(
        train_path, None, tiny_tokenizer(), 4, SEQ, cache_dir=tmp_path / "c"
    )
    assert sorted(map(tuple, rows(train))) == sorted(map(tuple, rows(train0)))


def test_waits_for_another_process_building_the_same_shards(corpus, tmp_path, monkeypatch):
    """A second process (a DDP rank) finding the build lock held waits for the manifest."""
    import wdsloader.training.text as text_mod
    from build_shards.commit.lock import OutputLockedError

    train_path, _, _, _ = corpus
    real = text_builder.build_text_shards
    calls = []

    def other_process_holds_the_lock(paths, output, *args, **kwargs):
        calls.append(output)
        real(paths, output, *args, **kwargs)  # the other process finishes meanwhile
        raise OutputLockedError(f"{output}: locked by another build")

    monkeypatch.setattr(text_builder, "build_text_shards", other_process_holds_the_lock)
    monkeypatch.setattr(text_mod, "BUILD_POLL_S", 0.0)
    train, _ = create_dataloaders(
        train_path, None, tiny_tokenizer(), 4, SEQ, cache_dir=tmp_path / "c"
    )
    assert len(calls) == 1 and len(rows(train)) > 0

    def always_locked(paths, output, *args, **kwargs):
        raise OutputLockedError(f"{output}: locked by another build")

    monkeypatch.setattr(text_builder, "build_text_shards", always_locked)
    monkeypatch.setattr(text_mod, "BUILD_WAIT_S", 0.0)
    with pytest.raises(TimeoutError, match="another process has been building these token shards"):
        create_dataloaders(train_path, None, tiny_tokenizer(), 4, 4, cache_dir=tmp_path / "c")


def _only_folder(cache, before=()):
    (new,) = set(os.listdir(cache)) - set(before)
    return cache / new


def test_a_cache_moved_under_another_name_is_refused_and_rebuild_replaces_it(corpus, tmp_path):
    """A seq_length=4 cache moved under the seq_length=8 name (or a cache of another tokenizer
    under this one's) is refused naming the folder and what differs, never served as
    (B, 4) batches; ``rebuild=True`` builds it again."""
    from wdsloader.errors import ManifestError

    train_path, _, train_docs, _ = corpus
    cache, tok = tmp_path / "cache", tiny_tokenizer()
    create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache)
    wanted = _only_folder(cache)
    create_dataloaders(train_path, None, tok, 4, 4, cache_dir=cache)
    short = _only_folder(cache, [wanted.name])
    shutil.rmtree(wanted)
    shutil.copytree(short, wanted)  # the seq_length=4 cache under the seq_length=8 name
    with pytest.raises(
        ManifestError,
        match=rf"{re.escape(str(wanted))}: these cached token shards were not built for this "
        rf"request: seq_length 4 \(requested {SEQ}\); stride 4 \(requested {SEQ}\); tokens "
        rf"shape \[5\] \(requested \[{SEQ + 1}\]\).*pass rebuild=True to create_dataloaders",
    ):
        create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache)
    train, _ = create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache, rebuild=True)
    assert {tuple(r) for r in rows(train)} <= {tuple(r) for r in chunks(train_docs)}
    create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache)  # now served as is

    other = tiny_tokenizer(template=True)  # same vocabulary, another template: other tokens
    before = os.listdir(cache)
    create_dataloaders(train_path, None, other, 4, SEQ, cache_dir=cache)
    shutil.rmtree(wanted)
    shutil.copytree(_only_folder(cache, before), wanted)
    with pytest.raises(ManifestError, match=r"not built for this request: tokenizer digest \w+"):
        create_dataloaders(train_path, None, tok, 4, SEQ, cache_dir=cache)


def test_a_broken_cache_advises_rebuild_which_create_dataloaders_accepts(
    corpus, tmp_path, monkeypatch
):
    """The builder's "pass overwrite=True" cannot be followed through create_dataloaders: the
    advice names ``rebuild=True``, which reaches the builder as ``overwrite=True``."""
    from build_shards.errors import SourceChangedError

    train_path, _, _, _ = corpus
    real, overwrites = text_builder.build_text_shards, []

    def changed(paths, output, *args, overwrite=False, **kwargs):
        overwrites.append(overwrite)
        if not overwrite:
            raise SourceChangedError(
                f"{output}: block 0 changed: pass overwrite=True to start over"
            )
        return real(paths, output, *args, overwrite=overwrite, **kwargs)

    monkeypatch.setattr(text_builder, "build_text_shards", changed)
    with pytest.raises(
        SourceChangedError, match=r"block 0 changed: pass rebuild=True \(create_dataloaders\) to"
    ):
        create_dataloaders(train_path, None, tiny_tokenizer(), 4, SEQ, cache_dir=tmp_path / "c")
    train, _ = create_dataloaders(
        train_path, None, tiny_tokenizer(), 4, SEQ, cache_dir=tmp_path / "c", rebuild=True
    )
    assert overwrites == [False, True] and len(rows(train)) > 0


def test_packing_by_documents_keeps_every_document_whole_and_apart(tmp_path, corpus):
    """packing="documents": every train document's tokens (with its separators) come once,
    each in one row segment of its own (positions restart, labels -100 at its first token),
    so no token attends to or is predicted from another document; fewer pad tokens than a
    batch per document would hold."""
    train, val, train_docs, val_docs = corpus
    loader, val_loader = create_dataloaders(
        train, val, tiny_tokenizer(), batch_size=2, seq_length=SEQ * 4,
        cache_dir=tmp_path / "cache", packing="documents",
    )  # fmt: skip
    want = sorted(tuple([BOS, *ids_of(d), EOS]) for d in val_docs)
    got, pad, total = [], 0, 0
    for b in val_loader:  # in order, drop_last=False: every document (padding rows repeat)
        ids, docs, pos, labels = b["input_ids"], b["document_ids"], b["position_ids"], b["labels"]
        assert ids.shape == (2, SEQ * 4)
        assert torch.all(labels[pos == 0] == -100) and torch.all(labels[docs < 0] == -100)
        for r in range(ids.shape[0]):
            for d in docs[r].unique().tolist():
                if d >= 0:
                    seg = ids[r][docs[r] == d]
                    assert pos[r][docs[r] == d].tolist() == list(range(len(seg)))
                    got.append(tuple(seg.tolist()))
        pad += int((docs < 0).sum())
        total += docs.numel()
    assert sorted(set(got)) == sorted(set(want)) and len(set(got)) == len(want)
    dropped_rows = loader.dropped  # drop_last: the rows that do not fill a batch are left out
    seen = [tuple(sorted(set(row) - {-1})) for b in loader for row in b["document_ids"].tolist()]
    docs_seen = [d for row in seen for d in row]
    assert len(docs_seen) == len(set(docs_seen))  # no document in two rows (none longer)
    assert len(docs_seen) <= len(train_docs) and (dropped_rows or len(docs_seen) == len(train_docs))
    assert pad < total
    with pytest.raises(ValueError, match="stride cuts fixed windows"):
        create_dataloaders(train, None, tiny_tokenizer(), packing="documents", stride=3)
