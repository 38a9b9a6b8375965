"""The house's floors, read from the code: no import cycle, no import that climbs back up.

The imports of every module of ``wdsloader`` and ``build_shards`` are parsed with :mod:`ast`
(module level and inside functions; ``if TYPE_CHECKING:`` blocks are not imports; relative imports
resolved), and the folder order is read from the layout list of docs/design.md ("Package layout"), so
the docs and the code cannot disagree silently.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("wdsloader", "build_shards")

# What build_shards may use of wdsloader besides format/, errors and the root leaf modules: the
# file-access glue (fsspec, set-up errors, the manifest's reading and writing) and the curriculum
# it checks before storing it as the loader's default. Nothing of the reader (plan, decode, stream).
BUILDER_MAY_IMPORT = (
    "wdsloader.io.storage",
    "wdsloader.io.setup_errors",
    "wdsloader.io.manifest_io",
    "wdsloader.curriculum",
)


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _ours(name: str) -> str | None:
    """The most specific module of ours that importing ``name`` loads."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, (ast.Name, ast.Attribute)) and ast.unparse(test).endswith(
            "TYPE_CHECKING"
        ):
            stack.extend(node.orelse)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _imports(name: str) -> dict[str, int]:
    """The modules of ours that module ``name`` imports -> the first line that does."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: dict[str, int] = {}
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str | None]
        if isinstance(node, ast.Import):
            targets = [_ours(a.name) for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _ours(base)
                for a in node.names
            ]
        for t in targets:
            if t is not None and t != name:
                edges.setdefault(t, node.lineno)
    return edges


GRAPH = {name: _imports(name) for name in MODULES}


def _where(name: str, target: str) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{GRAPH[name][target]} imports {target}"


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _root_leaves() -> set[str]:
    """Single-file modules at wdsloader's root that import only such modules."""
    leaves = {n for n, p in MODULES.items() if n.count(".") == 1 and p.parent == ROOT / "wdsloader"}
    leaves = {n for n in leaves if MODULES[n].name != "__init__.py"}
    changed = True
    while changed:
        bad = {n for n in leaves if any(_in(t, "wdsloader") and t not in leaves for t in GRAPH[n])}
        leaves -= bad
        changed = bool(bad)
    return leaves


def layout_folders(package: str = "wdsloader") -> list[str]:
    """The folders of ``package`` in the layout list of docs/design.md, top to bottom (arrows
    point down)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Package layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    lines = re.split(rf"^{package}/.*\n", block, maxsplit=1, flags=re.M)[1].splitlines()
    lines = list(itertools.takewhile(lambda line: not re.match(r"^\S", line), lines))
    return [m[1] for line in lines if (m := re.match(r"^  ([a-z_]+)/\s", line))]


def test_no_import_cycle():
    """Tarjan's strongly connected components: every one is a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is the longest import chain: a few dozen
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert cycles == []


def test_format_imports_nothing_above_it():
    allowed = _root_leaves() | {"wdsloader.errors"}
    bad = [
        _where(name, t)
        for name in MODULES
        if _in(name, "wdsloader.format")
        for t in GRAPH[name]
        if not _in(t, "wdsloader.format") and t not in allowed
    ]
    assert bad == []


def test_only_training_imports_the_builder():
    bad = [
        _where(name, t)
        for name in MODULES
        if _in(name, "wdsloader") and not _in(name, "wdsloader.training")
        for t in GRAPH[name]
        if _in(t, "build_shards")
    ]
    assert bad == []


def test_the_builder_uses_the_contract_not_the_reader():
    allowed = _root_leaves() | {"wdsloader.errors"}
    bad = [
        _where(name, t)
        for name in MODULES
        if _in(name, "build_shards")
        for t in GRAPH[name]
        if _in(t, "wdsloader")
        and not _in(t, "wdsloader.format")
        and t not in allowed
        and not any(_in(t, ok) for ok in BUILDER_MAY_IMPORT)
    ]
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_layout_doc_lists_every_folder(package):
    folders = sorted(p.parent.name for p in (ROOT / package).glob("*/__init__.py"))
    assert sorted(layout_folders(package)) == folders


def test_imports_point_down_the_layout_order():
    """A module imports from its own folder, the folders below it and the root leaf modules."""
    order = layout_folders()
    leaves = _root_leaves() | {"wdsloader.errors"}

    def floor(name: str) -> int:
        """0 for the root package and the root files that are no leaf: above every folder."""
        part = name.split(".")[1] if "." in name else ""
        return len(order) - order.index(part) if part in order else 0

    bad = []
    for name in MODULES:
        if not _in(name, "wdsloader") or floor(name) == 0:
            continue  # the root package (the public face) and its single-file modules
        for t in GRAPH[name]:
            if not _in(t, "wdsloader") or t in leaves:
                continue
            if floor(t) == 0 or floor(t) > floor(name):
                bad.append(_where(name, t))
    assert bad == []


def _private_uses(name: str) -> list[str]:
    """Where module ``name`` uses a private name (``_x``) of another module of ours: imported
    (``from m import _x``) or an attribute of a name it imported (``Class._x``)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    found = []
    for node in _import_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module) != name:
            for a in node.names:
                imported.add(a.asname or a.name)
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {ast.unparse(node)}")
    return found


def test_io_modules_use_only_public_names_of_each_other():
    """What one store module needs of another is public (named without ``_``, documented)."""
    bad = [use for name in MODULES if _in(name, "wdsloader.io") for use in _private_uses(name)]
    assert bad == []
