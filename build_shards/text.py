"""Tokenize text for language models and pack it into fixed-length chunks (stub)."""

from __future__ import annotations
