"""Text for language models: read documents, tokenize them, pack the token stream into chunks.

The pipeline is ``iter_documents`` (JSONL or plain text) -> ``pack_tokens`` (one token stream with
separators between documents, cut into chunks of ``seq_length + 1`` tokens) -> ``build_shards``
(one ``tokens.npy`` member per sample). A chunk of ``seq_length + 1`` tokens gives a causal LM
``seq_length`` inputs and their ``seq_length`` next-token labels (``loader_defaults`` names the
``causal_lm`` collator, which does the shift).

Document separators (the rule, in order):

1. ``bos_id`` / ``eos_id`` given explicitly are used as given (one or both).
2. A ``transformers`` tokenizer: its ``bos_token_id`` and ``eos_token_id``; when it declares
   neither, its ``cls_token_id`` (as BOS) and ``sep_token_id`` (as EOS).
3. A ``tokenizers.Tokenizer`` (which has no token roles): its *special* added tokens with a
   well-known name: BOS from ``<|begin_of_text|>``, ``<|startoftext|>``, ``<s>``, ``[BOS]``,
   ``<bos>``; EOS from ``<|end_of_text|>``, ``<|endoftext|>``, ``</s>``, ``[EOS]``, ``<eos>``;
   ``[CLS]``/``[SEP]`` only when none of those exist.
4. None found -> ``ValueError`` (pass ``bos_id=``/``eos_id=``).

Each document becomes ``[BOS] + ids + [EOS]`` with whichever of the two exists; when BOS and EOS
are the same token (GPT-2's ``<|endoftext|>``) only the EOS follows each document. Documents
are always encoded with ``add_special_tokens=False``, so the tokenizer's own template never
doubles the separators; ``pack_tokens(..., add_special_tokens=False)`` concatenates bare
documents (no separators at all).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from build_shards.errors import BuildError
from build_shards.options import BuildOptions
from build_shards.text.docs import PathArg, Paths, iter_documents
from build_shards.text.pack import PackStats, check_lengths, pack_tokens
from build_shards.text.tokens import is_tokenizers_lib, load_tokenizer, vocab_size
from wdsloader.format import FieldSpec, Manifest


def _tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"class": type(tokenizer).__name__, "vocab_size": vocab_size(tokenizer)}
    if is_tokenizers_lib(tokenizer):
        info["sha256"] = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    name = getattr(tokenizer, "name_or_path", None)
    if name and not os.path.isabs(str(name)):
        info["name"] = str(name)
    return info


def build_text_shards(
    paths: Paths,
    output: PathArg,
    tokenizer: Any,
    *,
    seq_length: int,
    stride: int | None = None,
    text_field: str = "text",
    add_special_tokens: bool = True,
    bos_id: int | None = None,
    eos_id: int | None = None,
    dtype: Any = None,
    record: Mapping[str, Any] | None = None,
    pack: str = "windows",
    **build_options: Any,
) -> Manifest:
    """Tokenize JSONL/text files and write the packed chunks as shards (``tokens.npy`` each).

    ``tokenizer`` is a tokenizer object or the path of a ``tokenizer.json``. The schema is
    declared (``tokens``: npy, the token dtype, shape ``[seq_length + 1]``), the loader default
    collator is ``causal_lm``, and ``manifest.build["text"]`` records the packing (tokenizer,
    seq_length, stride, separators, documents, tokens, chunks, dropped tail; plus the entries of
    ``record``, e.g. a cache's key) in the one manifest written; each chunk's length of
    ``tokens`` is recorded beside its shard (``lengths_path``). Other keyword arguments are
    those of :func:`build_shards.build_shards` (splits, ``shards=ShardOptions(...)``, workers,
    overwrite, storage_options, progress ...). No document or too few tokens for one chunk raises
    :class:`BuildError` before anything is written.

    ``pack="documents"`` writes each document as one sample instead (``input_ids``: its ids
    with the separators, any length), with its length recorded beside the shards
    (``samples=SampleOptions(lengths="input_ids")``) for a loader that packs documents into
    rows of ``seq_length`` tokens (``create_loader(packing=Packing(max_tokens=seq_length))``);
    the default collator is then ``packed``.
    """
    if pack not in ("windows", "documents"):
        raise ValueError(f'pack must be "windows" or "documents", got {pack!r}')
    from build_shards.build import run_build

    options = _build_options(build_options)
    stride = check_lengths(seq_length, stride)
    if not isinstance(paths, str | os.PathLike):
        paths = list(paths)
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = load_tokenizer(tokenizer)
    stats = PackStats()
    documents = iter_documents(paths, text_field=text_field)
    if pack == "documents":
        return _build_documents(
            documents, output, tokenizer, options, stats, paths,
            text={"seq_length": seq_length, "stride": stride, "text_field": text_field,
                  "add_special_tokens": add_special_tokens, "pack": pack, **dict(record or {})},
            add_special_tokens=add_special_tokens, dtype=dtype, bos_id=bos_id, eos_id=eos_id,
        )  # fmt: skip
    chunks = pack_tokens(
        documents,
        tokenizer,
        seq_length=seq_length,
        stride=stride,
        add_special_tokens=add_special_tokens,
        dtype=dtype,
        bos_id=bos_id,
        eos_id=eos_id,
        stats=stats,
    )
    first = next(chunks, None)
    if first is None:
        if stats.documents == 0:
            raise BuildError(f"{_describe(paths)}: no documents found")
        raise BuildError(
            f"{_describe(paths)}: {stats.documents} documents hold {stats.tokens} tokens, "
            f"fewer than one chunk of seq_length + 1 = {seq_length + 1}"
        )
    schema = {
        "tokens": FieldSpec(
            ext="tokens.npy", encoding="npy", dtype=stats.dtype, shape=[seq_length + 1]
        )
    }
    defaults = replace(options.defaults, collate=options.defaults.collate or "causal_lm")
    text = {
        "tokenizer": _tokenizer_info(tokenizer),
        "seq_length": seq_length,
        "stride": stride,
        "text_field": text_field,
        "add_special_tokens": add_special_tokens,
        **dict(record or {}),
    }
    # every chunk's length recorded (wdsloader.format.lengths), for token-weighted mixing
    samples = replace(options.samples, lengths=options.samples.lengths or "tokens")
    return run_build(
        itertools.chain([first], chunks),
        output,
        replace(options, schema=schema, defaults=defaults, samples=samples),
        build_record=_TextRecord(text, stats),
    )


def _build_documents(
    documents: Any,
    output: PathArg,
    tokenizer: Any,
    options: BuildOptions,
    stats: PackStats,
    paths: Paths,
    *,
    text: dict[str, Any],
    **encode: Any,
) -> Manifest:
    """The ``pack="documents"`` build: one sample per document, lengths recorded."""
    from build_shards.build import run_build
    from build_shards.text.documents import document_samples

    samples = document_samples(documents, tokenizer, stats=stats, **encode)
    first = next(samples, None)
    if first is None:
        raise BuildError(f"{_describe(paths)}: no documents found")
    defaults = replace(options.defaults, collate=options.defaults.collate or "packed")
    lengths = replace(options.samples, lengths=options.samples.lengths or "input_ids")
    text = {"tokenizer": _tokenizer_info(tokenizer), **text}
    return run_build(
        itertools.chain([first], samples),
        output,
        replace(options, defaults=defaults, samples=lengths),
        build_record=_TextRecord(text, stats),
    )


def _build_options(build_options: Mapping[str, Any]) -> BuildOptions:
    """The build's options from ``build_text_shards``' other keywords (those it sets itself are
    a TypeError)."""
    from build_shards.resolve import resolve_options

    for reserved in ("schema", "source", "key_field", "build_record"):
        if reserved in build_options:
            raise TypeError(f"build_text_shards sets {reserved!r} itself")
    # stacklevel 4: a deprecation warning points at the call of build_text_shards
    options = resolve_options(build_options, caller="build_text_shards", stacklevel=4)
    if options.samples.key_field != "__key__":
        raise TypeError("build_text_shards sets the key itself: samples.key_field is not taken")
    return options


class _TextRecord:
    """``manifest.build["text"]``: the packing options and what packing counted (read once the
    chunks are consumed, so the one manifest written holds it)."""

    def __init__(self, text: dict[str, Any], stats: PackStats) -> None:
        self.text, self.stats = text, stats

    def __call__(self) -> dict[str, Any]:
        return {"text": {**self.text, **asdict(self.stats)}}


def _describe(paths: Paths) -> str:
    if isinstance(paths, str | os.PathLike):
        return os.fspath(paths)
    items = [os.fspath(p) for p in paths]
    return items[0] if len(items) == 1 else f"{items[0]} (+{len(items) - 1} more)"
