"""Text for language models: documents, separators, packing into seq_length + 1 chunks."""

from __future__ import annotations

import io
import json
import logging
import random

import fsspec
import numpy as np
import pytest

from build_shards.errors import BuildError
from build_shards.text import PackStats, build_text_shards, iter_documents, pack_tokens
from build_shards.text.tokens import document_separators
from wdsloader.format.lengths import read_split_lengths

tokenizers = pytest.importorskip("tokenizers")

WORDS = [
    "alpha", "beta", "gamma", "delta", "loader", "shard", "token", "stream", "split", "river",
    "stone", "cloud", "paper", "green", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
]  # fmt: skip


def make_corpus(n_docs: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        n = rng.randint(3, 40)
        docs.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    return docs


def train_tokenizer(special: list[str]) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_corpus(300, seed=1), trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["[UNK]", "[BOS]", "[EOS]"])


def reference_stream(tok, docs: list[str], bos: int | None, eos: int | None) -> list[int]:
    """The token stream written out by hand: [BOS] doc [EOS] for every document, in order."""
    stream: list[int] = []
    for doc in docs:
        ids = tok.encode(doc, add_special_tokens=False).ids
        assert ids, "every test document has tokens"
        stream += ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
    return stream


def reference_chunks(stream: list[int], seq_length: int, stride: int) -> list[list[int]]:
    chunks = []
    start = 0
    while start + seq_length + 1 <= len(stream):
        chunks.append(stream[start : start + seq_length + 1])
        start += stride
    return chunks


# -- documents -----------------------------------------------------------------------------------
def test_iter_documents_jsonl_and_text(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "first doc", "id": 1})
        + "\n\n"
        + json.dumps({"text": "second\ndoc"})
        + "\n"
    )
    (tmp_path / "b.txt").write_text(
        "\n\n  para one line 1\npara one line 2  \n\n\n \t \npara two\n\n\n   \n"
    )
    (tmp_path / "c.txt").write_text("last one")
    docs = list(iter_documents([tmp_path / "a.jsonl", str(tmp_path / "*.txt")]))
    assert docs == [
        "first doc",
        "second\ndoc",
        "para one line 1\npara one line 2",
        "para two",
        "last one",
    ]


def test_iter_documents_text_field_and_gzip(tmp_path):
    import gzip

    with gzip.open(tmp_path / "x.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "zipped"}) + "\n")
    assert list(iter_documents(tmp_path / "x.jsonl.gz", text_field="body")) == ["zipped"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "invalid JSON"),
        ('{"title": "x"}', "no field 'text'"),
        ('{"text": 3}', "not a string"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_iter_documents_bad_jsonl_line_names_file_and_line(tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n\n" + line + "\n")
    it = iter_documents(path)
    assert next(it) == "ok"
    with pytest.raises(BuildError) as err:
        next(it)
    assert f"{path}:3:" in str(err.value)
    assert needle in str(err.value)


def test_iter_documents_not_utf8_names_line(tmp_path):
    path = tmp_path / "bin.txt"
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(BuildError, match=r"bin\.txt:2: not UTF-8"):
        list(iter_documents(path))


def test_iter_documents_missing_inputs(tmp_path):
    with pytest.raises(BuildError, match="not found: .*nope.jsonl"):
        list(iter_documents(tmp_path / "nope.jsonl"))
    with pytest.raises(BuildError, match="no input file matches"):
        list(iter_documents(str(tmp_path / "*.jsonl")))
    with pytest.raises(BuildError, match="is a folder"):
        list(iter_documents(tmp_path))


# -- separators ----------------------------------------------------------------------------------
def test_separators_from_tokenizer_and_explicit(tok):
    assert document_separators(tok) == (tok.token_to_id("[BOS]"), tok.token_to_id("[EOS]"))
    bare = train_tokenizer(["[UNK]"])
    with pytest.raises(ValueError, match="no BOS/EOS/SEP"):
        document_separators(bare)
    assert document_separators(bare, eos_id=0) == (None, 0)
    bert_like = train_tokenizer(["[UNK]", "[CLS]", "[SEP]"])
    assert document_separators(bert_like) == (1, 2)


# -- packing -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seq_length", "stride"), [(16, None), (16, 5), (7, 1), (8, 12)])
def test_pack_matches_hand_reference(tok, seq_length, stride):
    docs = make_corpus(60)
    bos, eos = tok.token_to_id("[BOS]"), tok.token_to_id("[EOS]")
    stream = reference_stream(tok, docs, bos, eos)
    expected = reference_chunks(stream, seq_length, stride or seq_length)
    stats = PackStats()
    samples = list(pack_tokens(docs, tok, seq_length=seq_length, stride=stride, stats=stats))
    assert len(expected) > 10
    assert [s["tokens"].tolist() for s in samples] == expected
    assert [s["__key__"] for s in samples] == [f"{i:010d}" for i in range(len(expected))]
    for s in samples:
        assert s["tokens"].shape == (seq_length + 1,)
        assert s["tokens"].dtype == np.uint16
    assert (stats.documents, stats.tokens, stats.chunks) == (60, len(stream), len(expected))
    assert stream.count(bos) == stream.count(eos) == 60


def test_default_stride_chunks_share_exactly_one_token(tok):
    seq_length = 10
    docs = make_corpus(40)
    samples = [s["tokens"] for s in pack_tokens(docs, tok, seq_length=seq_length)]
    stream = reference_stream(tok, docs, 1, 2)
    for a, b in zip(samples, samples[1:], strict=False):
        assert a[-1] == b[0]
    # together they are the stream, with the shared token counted once
    rebuilt = np.concatenate([samples[0]] + [s[1:] for s in samples[1:]])
    assert rebuilt.tolist() == stream[: len(rebuilt)]


def test_overlap_with_small_stride(tok):
    samples = [s["tokens"] for s in pack_tokens(make_corpus(20), tok, seq_length=12, stride=4)]
    for a, b in zip(samples, samples[1:], strict=False):
        assert a[4:].tolist() == b[:9].tolist()


def test_tail_drop_is_logged_with_count(tok, caplog):
    docs = make_corpus(30)
    stream = reference_stream(tok, docs, 1, 2)
    seq_length, stride = 16, 16
    n_chunks = (len(stream) - (seq_length + 1)) // stride + 1
    dropped = len(stream) - ((n_chunks - 1) * stride + seq_length + 1)
    assert 0 < dropped, "corpus chosen so the tail is incomplete"
    stats = PackStats()
    with caplog.at_level(logging.INFO, logger="build_shards.text"):
        out = list(pack_tokens(docs, tok, seq_length=seq_length, stats=stats))
    assert len(out) == n_chunks
    assert stats.dropped_tail_tokens == dropped
    assert f"dropped the incomplete tail: {dropped} tokens" in caplog.text
    # the last emitted chunk ends exactly `dropped` tokens before the stream does
    assert (
        out[-1]["tokens"].tolist()
        == stream[len(stream) - dropped - seq_length - 1 :][: seq_length + 1]
    )


def test_no_separators_and_same_bos_eos(tok):
    docs = make_corpus(10)
    bare = list(pack_tokens(docs, tok, seq_length=8, add_special_tokens=False))
    stream = reference_stream(tok, docs, None, None)
    assert [s["tokens"].tolist() for s in bare] == reference_chunks(stream, 8, 8)
    # GPT-2 style: one token is both BOS and EOS -> it only follows each document
    same = list(pack_tokens(docs, tok, seq_length=8, bos_id=2, eos_id=2))
    assert [s["tokens"].tolist() for s in same] == reference_chunks(
        reference_stream(tok, docs, None, 2), 8, 8
    )


def test_bare_tokenizer_without_ids_is_an_error():
    bare = train_tokenizer(["[UNK]"])
    with pytest.raises(ValueError, match="bos_id"):
        list(pack_tokens(["a b"], bare, seq_length=4))


def test_transformers_tokenizer_gives_the_same_tokens(tok):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]"
    )
    docs = make_corpus(50)
    a = [s["tokens"] for s in pack_tokens(docs, tok, seq_length=16, stride=6)]
    b = [s["tokens"] for s in pack_tokens(docs, fast, seq_length=16, stride=6)]
    assert len(a) == len(b) > 10
    assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # a transformers tokenizer that declares no roles has nothing to separate documents with
    plain = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    with pytest.raises(ValueError, match="no BOS/EOS/SEP"):
        list(pack_tokens(docs, plain, seq_length=16))


class _BigVocab:
    """A duck-typed tokenizer: ``.encode`` returns a list, ids up to 70000."""

    vocab_size = 70_000
    eos_token_id = 69_999

    def encode(self, text: str) -> list[int]:
        return [66_000 + len(w) for w in text.split()]


def test_dtype_follows_vocab_and_overflow_is_an_error(tok):
    out = list(pack_tokens(["a bb ccc", "dddd"], _BigVocab(), seq_length=3))
    assert out[0]["tokens"].dtype == np.uint32
    assert out[0]["tokens"].tolist() == [66_001, 66_002, 66_003, 69_999]
    as_int32 = next(pack_tokens(make_corpus(5), tok, seq_length=4, dtype="int32"))
    assert as_int32["tokens"].dtype == np.int32
    with pytest.raises(ValueError, match="does not fit dtype uint8"):
        list(pack_tokens(make_corpus(5), tok, seq_length=4, dtype="uint8"))
    with pytest.raises(ValueError, match="seq_length"):
        list(pack_tokens([], tok, seq_length=0))
    with pytest.raises(ValueError, match="stride"):
        list(pack_tokens([], tok, seq_length=4, stride=0))


# -- end to end (needs build_shards.build_shards) ------------------------------------------------
def _read_tokens(root) -> dict[str, np.ndarray]:
    from wdsloader.format import Manifest, iter_samples

    manifest = Manifest.load(root)
    out = {}
    for split in manifest.splits.values():
        for shard in split.shards:
            data = (root / shard.path).read_bytes()
            for key, _, fields in iter_samples(data):
                off, size = fields["tokens.npy"]
                out[key] = np.load(io.BytesIO(data[off : off + size]), allow_pickle=False)
    return out


def test_build_text_shards_end_to_end(tmp_path, tok):
    from wdsloader.format import Manifest

    docs = make_corpus(80)
    with open(tmp_path / "in.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"content": d}) + "\n")
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    out = tmp_path / "ds"
    manifest = build_text_shards(
        tmp_path / "in.jsonl",
        out,
        str(tok_path),
        seq_length=16,
        stride=8,
        text_field="content",
        shard_max_count=20,
    )
    expected = reference_chunks(reference_stream(tok, docs, 1, 2), 16, 8)
    loaded = Manifest.load(out)
    assert loaded.schema["tokens"].ext == "tokens.npy"
    assert loaded.schema["tokens"].dtype == "uint16"
    assert loaded.schema["tokens"].shape == [17]
    assert loaded.loader_defaults["collate"] == "causal_lm"
    text = loaded.build["text"]
    assert (text["seq_length"], text["stride"], text["chunks"]) == (16, 8, len(expected))
    assert (text["bos_id"], text["eos_id"], text["documents"]) == (1, 2, 80)
    assert loaded.num_samples == manifest.num_samples == len(expected)
    got = _read_tokens(out)
    assert sorted(got) == [f"{i:010d}" for i in range(len(expected))]
    for i, chunk in enumerate(expected):
        arr = got[f"{i:010d}"]
        assert arr.dtype == np.uint16 and arr.tolist() == chunk
    # every chunk's length recorded beside its shard, for token-weighted mixing
    assert loaded.build["lengths_field"] == "tokens"
    lengths = read_split_lengths(fsspec.filesystem("file"), str(out), loaded.split("train").shards)
    assert lengths.tolist() == [17] * loaded.split("train").num_samples


def test_build_text_shards_too_few_tokens_writes_nothing(tmp_path, tok):
    (tmp_path / "tiny.txt").write_text("alpha beta\n\n\n")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(BuildError, match="fewer than one chunk"):
        build_text_shards(tmp_path / "tiny.txt", tmp_path / "out", tok, seq_length=64)
    with pytest.raises(BuildError, match="no documents"):
        build_text_shards(tmp_path / "empty.txt", tmp_path / "out", tok, seq_length=64)
    assert not (tmp_path / "out").exists()


def test_the_one_manifest_written_holds_the_text_record(tmp_path, tok, monkeypatch):
    """``manifest.json``'s presence means a finished dataset: a reader that sees it (a DDP rank
    waiting on a shared text cache) must find the packing record in it, not a first version
    without ``build["text"]`` rewritten a moment later."""
    import build_shards.build as builder
    from wdsloader.format import Manifest

    (tmp_path / "in.txt").write_text("\n\n".join(make_corpus(30)) + "\n")
    seen = []
    real = builder.run_build

    def spy(source, output, options, **kwargs):
        manifest = real(source, output, options, **kwargs)
        seen.append(Manifest.load(output).build.get("text"))  # as written by the build
        return manifest

    monkeypatch.setattr(builder, "run_build", spy)
    out = tmp_path / "ds"
    build_text_shards(tmp_path / "in.txt", out, tok, seq_length=8, record={"cache": {"key": "k"}})
    assert len(seen) == 1 and seen[0] is not None
    assert (seen[0]["seq_length"], seen[0]["cache"]) == (8, {"key": "k"})
    assert seen[0]["chunks"] == Manifest.load(out).num_samples > 0
    assert Manifest.load(out).build["text"] == seen[0]
