"""A main script that calls ``build_shards(workers > 1)`` without an ``if __name__ ==
"__main__":`` guard, found before any worker starts.

Worker processes (forkserver or spawn) import the main script again; an unguarded call would
start a second build in each of them. :func:`build_shards.engines.pool.refuse_reimported_main` stops
such a worker, but only once workers run (seconds later, after the source was opened). This
check reads the call stack and the script's source instead, at the start of the build.
"""

from __future__ import annotations

import ast
import sys
from types import FrameType

from build_shards.engines.pool import GUARD_HINT
from build_shards.errors import BuildError


def unguarded_main_line(frame: FrameType | None) -> tuple[str, int] | None:
    """``(file, line)`` of the main script's top-level statement that leads to ``frame`` when
    that statement is not inside the body of an ``if __name__ == "__main__":``, else None (also
    when the main module has no file, as in a notebook or ``python -c``: workers do not import
    it then, or when its source cannot be read)."""
    if getattr(sys.modules.get("__main__"), "__file__", None) is None:
        return None
    top = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            top = frame
        frame = frame.f_back
    if top is None:
        return None
    path, line = top.f_code.co_filename, top.f_lineno
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    return None if _guarded(tree.body, line) else (path, line)


def _guarded(body: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` of the statements ``body`` is inside the body of a main guard, at any
    depth of compound statements (``try:``, ``with``, ...; not functions or classes)."""
    for node in body:
        if not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        if _is_main_guard(node):
            return _within(node.body, line)  # type: ignore[attr-defined]
        inner = [getattr(node, part, []) for part in ("body", "orelse", "finalbody")]
        inner += [h.body for h in getattr(node, "handlers", [])]
        inner += [case.body for case in getattr(node, "cases", [])]
        return any(_guarded(b, line) for b in inner if isinstance(b, list))
    return False


def _within(body: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` is within one of the statements ``body``."""
    return any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in body)


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def refuse_unguarded_main(workers: int) -> None:
    """A :class:`BuildError` naming the script and line when a build with ``workers`` worker
    processes is called from the main script's unguarded top level."""
    found = unguarded_main_line(sys._getframe(1))
    if found is not None:
        path, line = found
        raise BuildError(
            f"{path}:{line}: workers={workers} starts worker processes, which import this "
            f"script again and would run this build call again; {GUARD_HINT}"
        )
