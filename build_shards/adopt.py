"""Adopt WebDataset shards written by other tools: write idx files and a manifest (stub)."""

from __future__ import annotations
