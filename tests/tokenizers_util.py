"""Tiny tokenizers for tests, built in memory (nothing is downloaded).

``tiny_tokenizer()`` is a ``tokenizers.Tokenizer``: word-level over ``WORDS`` (``w0`` ..
``w49``), split on whitespace, with the special tokens ``SPECIAL`` at ids 0..4
(``[PAD]``=0, ``[UNK]``=1, ``[BOS]``=2, ``[EOS]``=3, ``[MASK]``=4); ``WORDS[i]`` is id 5 + i.
``tiny_hf_tokenizer()`` wraps it in ``transformers.PreTrainedTokenizerFast`` with those roles.
``words(n, seed)`` is a reproducible text of ``n`` words.
"""

from __future__ import annotations

import random
from typing import Any

SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "[MASK]"]
WORDS = [f"w{i}" for i in range(50)]
PAD, UNK, BOS, EOS, MASK = range(5)
FIRST_WORD = len(SPECIAL)


def tiny_tokenizer(*, template: bool = False) -> Any:
    """A word-level ``tokenizers.Tokenizer`` (see the module docstring); ``template=True``
    adds ``[BOS] ... [EOS]`` around each text when special tokens are added."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="[BOS] $A [EOS]", special_tokens=[("[BOS]", BOS), ("[EOS]", EOS)]
        )
    return tok


def tiny_hf_tokenizer(*, template: bool = False, padding_side: str = "right") -> Any:
    """``tiny_tokenizer()`` as a ``transformers.PreTrainedTokenizerFast`` with pad, unk, bos,
    eos and mask tokens set."""
    import transformers

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer(template=template),
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        mask_token="[MASK]",
        padding_side=padding_side,
    )


def words(n: int, seed: int = 0) -> str:
    """``n`` words of ``WORDS`` drawn reproducibly from ``seed``, space-separated."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def ids_of(text: str) -> list[int]:
    """The token ids ``tiny_tokenizer()`` gives ``text`` (no special tokens)."""
    return [FIRST_WORD + WORDS.index(w) for w in text.split()]
