"""Tokenizers for the text builder: load a ``tokenizer.json``, its vocabulary size, the document
separators (the rule is in :mod:`build_shards.text`), batch encoding and the token dtype."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from build_shards.errors import BuildError, naming_options
from build_shards.text.docs import PathArg

_BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "[BOS]", "<bos>")
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "[EOS]", "<eos>")


def is_tokenizers_lib(tokenizer: Any) -> bool:
    return hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size")


def load_tokenizer(path: PathArg) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file (nothing is downloaded)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tokenizing text needs `tokenizers` (pip install wdsloader[text])"
        ) from exc
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises a bare Exception for a bad file
        raise BuildError(f"{path}: not a tokenizers tokenizer.json ({exc})") from None


def vocab_size(tokenizer: Any) -> int | None:
    """Number of token ids the tokenizer can produce (added tokens included), if it says."""
    if is_tokenizers_lib(tokenizer):
        return int(tokenizer.get_vocab_size(with_added_tokens=True))
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)
    size = getattr(tokenizer, "vocab_size", None)
    return int(size) if size is not None else None


def document_separators(
    tokenizer: Any, *, bos_id: int | None = None, eos_id: int | None = None
) -> tuple[int | None, int | None]:
    """``(bos, eos)`` ids put around each document, by the rule in :mod:`build_shards.text`'s docstring.

    Raises ``ValueError`` when neither is given nor defined by the tokenizer.
    """
    if bos_id is not None or eos_id is not None:
        return bos_id, eos_id
    bos: int | None = None
    eos: int | None = None
    if is_tokenizers_lib(tokenizer):
        special = {
            tok.content: tid
            for tid, tok in tokenizer.get_added_tokens_decoder().items()
            if getattr(tok, "special", True)
        }
        bos = next((special[n] for n in _BOS_NAMES if n in special), None)
        eos = next((special[n] for n in _EOS_NAMES if n in special), None)
        if bos is None and eos is None:
            bos, eos = special.get("[CLS]"), special.get("[SEP]")
    else:
        bos = getattr(tokenizer, "bos_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        if bos is None and eos is None:
            bos = getattr(tokenizer, "cls_token_id", None)
            eos = getattr(tokenizer, "sep_token_id", None)
    if bos is None and eos is None:
        raise naming_options(
            ValueError(
                "the tokenizer defines no BOS/EOS/SEP token to separate documents; pass bos_id= "
                "and/or eos_id=, or add_special_tokens=False to concatenate documents without "
                "separators"
            ),
            "bos_id",
            "eos_id",
            "add_special_tokens",
        )
    return bos, eos


def encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without the tokenizer's own special tokens."""
    if is_tokenizers_lib(tokenizer):
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    if callable(tokenizer):  # transformers
        return list(tokenizer(texts, add_special_tokens=False)["input_ids"])
    out = []
    for text in texts:
        enc = tokenizer.encode(text)
        out.append(list(getattr(enc, "ids", enc)))
    return out


def token_dtype(size: int | None) -> np.dtype:
    """The dtype chunks are stored in: uint16 when every id fits (ids < 65536), else uint32."""
    if size is not None and size <= 2**16:
        return np.dtype("uint16")
    return np.dtype("uint32")
