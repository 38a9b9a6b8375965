"""Imported by every interpreter started with this folder on PYTHONPATH (workers included): hides
every installed third-party module that the package's base requirements do not bring in, so a
script run this way sees what a `make demo` install (no extras) gives. Test-only."""

from __future__ import annotations

import importlib.abc
import os
import sys

_BLOCKED = frozenset(filter(None, os.environ.get("BASE_DEPS_ONLY_BLOCKED", "").split(",")))


class _HideExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002
        if fullname.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (hidden: not a base requirement)"
            )
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _HideExtras())
