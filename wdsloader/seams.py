"""Seams between layers: a lower layer names what it needs, the package root names the module
that provides it, and that module is imported on first use (it registers itself when imported),
so that ``import wdsloader`` stays light and no layer imports one above it."""

from __future__ import annotations

import importlib

_PROVIDERS: dict[str, str] = {}


def provide(seam: str, module: str) -> None:
    """Name ``module`` as the provider of ``seam`` (the first one named is kept)."""
    _PROVIDERS.setdefault(seam, module)


def load_provider(seam: str) -> None:
    """Import the module that provides ``seam``; a LookupError when none was named."""
    module = _PROVIDERS.get(seam)
    if module is None:
        raise LookupError(f"no module provides {seam!r}")
    importlib.import_module(module)
