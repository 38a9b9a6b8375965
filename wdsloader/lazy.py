"""Names of a package imported on first use (PEP 562), for packages whose modules import heavy
dependencies or each other; and old names that still resolve, with a ``DeprecationWarning``."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: The release in which the deprecated names stop resolving.
REMOVED_IN = "0.2.0"

#: Old name -> ``(module, name)``: where it lives now.
Moved = Mapping[str, tuple[str, str]]


def _moved(package: str, name: str, target: tuple[str, str]) -> Any:
    """The object ``package.name`` now is, after a ``DeprecationWarning`` naming its import."""
    module, new = target
    warnings.warn(
        f"{package}.{name} is deprecated and goes away in wdsloader {REMOVED_IN}: use "
        f"`from {module} import {new}`",
        DeprecationWarning,
        stacklevel=3,  # the code that read the name, above __getattr__
    )
    return getattr(importlib.import_module(module), new)


def moved_names(package: str, moved: Moved) -> Callable[[str], Any]:
    """``__getattr__`` for a module whose old names ``moved`` still resolve, with a warning."""

    def __getattr__(name: str) -> Any:
        if name in moved:
            return _moved(package, name, moved[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def lazy_exports(
    package: str, exports: Mapping[str, str], moved: Moved | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the
    module that defines it; a name is imported when first read, then kept in the package.
    The old names in ``moved`` resolve with a ``DeprecationWarning`` at every read (they are
    never kept in the package, nor listed by ``dir()``)."""
    namespace = sys.modules[package].__dict__
    old: Moved = moved or {}

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            if name in old:
                return _moved(package, name, old[name])
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
