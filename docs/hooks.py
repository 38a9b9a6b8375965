"""MkDocs hooks: the API reference pages list the public names of the packages, read from the code.

A page holding ``<!-- api: PACKAGE -->`` gets one mkdocstrings block per name of
``PACKAGE.__all__``, grouped by the subpackage that defines it, so a name added to or removed from
``__all__`` appears in or leaves the reference without editing the page. The docstrings use reST
roles (``:class:`~wdsloader.mix.MixSource```); their role prefix and ``~`` are dropped from the
rendered HTML so the name reads as code.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_MARKER = re.compile(r"<!-- api: ([a-z_]+) -->")
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*([\w]+)</code>")

# The subpackages in the order a reader meets them; a subpackage not listed goes last.
_GROUPS = {
    "wdsloader.stream": "The loader",
    "wdsloader.io": "Reads",
    "wdsloader.mix": "Mixing",
    "wdsloader.curriculum": "Curriculum",
    "wdsloader.collate": "Collators and task specs",
    "wdsloader.training": "Training API",
    "wdsloader.validate": "Validation",
    "wdsloader.errors": "Errors",
    "build_shards.build": "Building",
    "build_shards.sources": "Sources",
    "build_shards.adopt": "Adopting other tools' shards",
    "build_shards.layout": "Splits",
    "build_shards.commit": "Errors",
    "build_shards.errors": "Errors",
}


def _path(package: Any, name: str) -> str:
    """The dotted path of the object ``package.name`` where it is defined."""
    obj = getattr(package, name)
    if getattr(obj, "__qualname__", None) == name and hasattr(obj, "__module__"):
        return f"{obj.__module__}.{name}"
    exports = getattr(package, "_EXPORTS", {})  # a lazily exported alias (``Batch = dict[...]``)
    target = exports.get(name, package.__name__)
    sub = importlib.import_module(target)
    return f"{getattr(sub, '_EXPORTS', {}).get(name, target)}.{name}"


def _group(path: str) -> tuple[int, str]:
    """The section of ``path``: its title, ordered by the title's first place in ``_GROUPS``."""
    titles = list(dict.fromkeys(_GROUPS.values()))
    for prefix, title in _GROUPS.items():
        if path == prefix or path.startswith(prefix + "."):
            return titles.index(title), title
    return len(titles), "Other"


def api_markdown(package_name: str) -> str:
    """The reference of ``package_name.__all__``: a section per group, a block per name."""
    package = importlib.import_module(package_name)
    groups: dict[tuple[int, str], list[str]] = {}
    for name in package.__all__:
        path = _path(package, name)
        groups.setdefault(_group(path), []).append(path)
    parts = []
    for (_, title), paths in sorted(groups.items()):
        parts.append(f"## {title}\n")
        parts.extend(f"::: {path}\n" for path in paths)
    return "\n".join(parts)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return _MARKER.sub(lambda m: api_markdown(m[1]), markdown)


def on_page_content(html: str, **kwargs: Any) -> str:
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html))
