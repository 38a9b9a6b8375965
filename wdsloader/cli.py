"""The ``wdsloader`` command line (stub)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise NotImplementedError
