"""Text for language models: read documents, tokenize them, pack the token stream into chunks."""

from build_shards.text.docs import iter_documents
from build_shards.text.pack import PackStats, pack_tokens
from build_shards.text.shards import build_text_shards
from build_shards.text.tokens import load_tokenizer

__all__ = ["PackStats", "build_text_shards", "iter_documents", "load_tokenizer", "pack_tokens"]
