"""Small typed checks of manifest values: one function per kind of value, each naming the field;
and :func:`as_int`, the one integer check of arguments (plan, curriculum, manifest counts).

Each manifest check takes the value and ``where``, the field's path in the manifest
(``splits.train.shards[3].num_samples``), and raises :class:`InvalidField` (a ValueError) whose
message starts with that path. :func:`path_problem` says why a shard or index path is refused.
"""

from __future__ import annotations

import operator
import re
import reprlib
from typing import Any, SupportsIndex, cast

MAX_INT = 2**63 - 1  # what an int64 offset or count holds
MAX_DEPTH = 32  # nesting of the free-form parts (build, loader_defaults)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
# a safe path (see path_problem): segments of allowed characters, none of them "." or ".."
_SEGMENT = r"(?!\.\.?(?:/|$))[^/%\\\x00-\x1f\x7f?#:]+"
_SAFE_PATH = re.compile(rf"(?:{_SEGMENT}/)*{_SEGMENT}")

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60


class InvalidField(ValueError):
    """A manifest value of the wrong type or range; the message starts with its field path."""


def _fail(where: str, expected: str, value: Any) -> InvalidField:
    return InvalidField(f"{where}: expected {expected}, got {_short.repr(value)}")


def check_obj(value: Any, where: str) -> dict[str, Any]:
    """A JSON object (dict)."""
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def check_list(value: Any, where: str) -> list[Any]:
    """A JSON array (list; a tuple from Python code too)."""
    if not isinstance(value, list | tuple):
        raise _fail(where, "a list", value)
    return list(value)


def check_str(value: Any, where: str, *, optional: bool = False) -> str | None:
    """A non-empty string (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(where, "a non-empty string", value)
    return value


def as_int(value: object, what: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int: a Python or numpy integer (bools, floats and strings refused) between
    ``low`` and ``high`` when given. Raises ValueError ``"WHAT must be an integer, got VALUE"``,
    ``"WHAT must be >= LOW, got N"`` or ``"WHAT must be <= HIGH, got N"``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    n = operator.index(cast(SupportsIndex, value))
    if low is not None and n < low:
        raise ValueError(f"{what} must be >= {low}, got {n}")
    if high is not None and n > high:
        raise ValueError(f"{what} must be <= {high}, got {n}")
    return n


def check_total(total: int, what: str) -> None:
    """A sum of counts that must fit int64: ``"WHAT sum to N, more than an int64 holds"``."""
    if total > MAX_INT:
        raise InvalidField(f"{what} sum to {total}, more than an int64 holds ({MAX_INT})")


def check_count(value: Any, where: str) -> int:
    """A non-negative integer that fits int64 (bools and floats refused)."""
    try:
        return as_int(value, where, 0, MAX_INT)
    except ValueError:
        raise _fail(where, "a non-negative integer", value) from None


def check_number(value: Any, where: str) -> float:
    """An int or float (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(where, "a number", value)
    return value


def check_keys(value: dict[str, Any], where: str, required: set[str], allowed: set[str]) -> None:
    """``value`` holds every key of ``required`` and no key outside ``allowed``."""
    keys = value.keys()
    if required <= keys and keys <= allowed:
        return
    missing = sorted(required - value.keys())
    if missing:
        raise InvalidField(f"{where}: missing {', '.join(map(repr, missing))}")
    unknown = sorted(value.keys() - allowed)
    if unknown:
        raise InvalidField(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {sorted(allowed)}"
        )


def check_optional(optional: Any, where: str) -> None:
    """A field's ``optional`` flag: None or a bool."""
    if optional is not None and not isinstance(optional, bool):
        raise InvalidField(f"{where}.optional: expected true, false or null, got {optional!r}")


def check_shape(value: Any, where: str) -> list[int | str] | None:
    """None, or a list of dims: non-negative ints or non-empty symbolic names."""
    if value is None:
        return None
    dims = check_list(value, where)
    for i, dim in enumerate(dims):
        if isinstance(dim, str):
            check_str(dim, f"{where}[{i}]")
        else:
            check_count(dim, f"{where}[{i}]")
    return dims


def check_range(value: Any, where: str) -> list[float] | None:
    """None, or ``[low, high]`` numbers with ``low <= high``."""
    if value is None:
        return None
    pair = check_list(value, where)
    if len(pair) != 2:
        raise _fail(where, "[low, high]", value)
    low, high = (check_number(v, f"{where}[{i}]") for i, v in enumerate(pair))
    if low > high:
        raise _fail(where, "[low, high] with low <= high", value)
    return pair


def check_array_dtype(value: Any, where: str) -> None:
    """A numpy dtype name that needs no pickle (``float32``, ``<i8``...)."""
    import numpy as np

    check_str(value, where)
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise _fail(where, "a numpy dtype name", value) from None
    if dtype.hasobject:
        raise _fail(where, "a numpy dtype without Python objects", value)


def check_sha256(value: Any, where: str) -> str | None:
    """None, or 64 hex digits."""
    if value is None:
        return None
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise _fail(where, "a sha256 of 64 hex digits", value)
    return value


def check_layout(value: Any, where: str) -> dict[str, list[int]] | None:
    """None, or ``{member extension: [offset, size]}`` with non-negative ints."""
    if value is None:
        return None
    for ext, pair in check_obj(value, where).items():
        if (  # the common case, checked inline (manifests list up to millions of shards)
            type(ext) is str
            and ext
            and type(pair) is list
            and len(pair) == 2
            and type(pair[0]) is int
            and type(pair[1]) is int
            and 0 <= pair[0] <= MAX_INT
            and 0 <= pair[1] <= MAX_INT
        ):
            continue
        at = f"{where}.{ext}"
        check_str(ext, at)
        items = check_list(pair, at)
        if len(items) != 2:
            raise _fail(at, "[offset, size]", pair)
        for i, v in enumerate(items):
            check_count(v, f"{at}[{i}]")
    return cast("dict[str, list[int]]", value)


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` levels (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, list | tuple):
            children = list(node)
        else:
            continue
        if depth > limit:
            raise InvalidField(f"{where}: nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children)


def path_problem(path: Any) -> str | None:
    """Why ``path`` cannot be a shard or index path, or None when it is safe.

    A safe path is relative, ``/``-separated and already normal: no empty, ``.`` or ``..``
    segment. Anything a URL or a filesystem could decode into another path is refused outright
    rather than decoded: ``%`` (percent-encoding), backslashes, NUL and control characters,
    ``?``/``#`` (a query or fragment over HTTP) and ``:`` (a URL scheme, a drive letter, an
    fsspec chain).
    """
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if _SAFE_PATH.fullmatch(path):
        return None
    if "%" in path:
        return "percent-encoding ('%') is refused"
    if "\\" in path:
        return "backslashes are refused"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "control characters (NUL...) are refused"
    if "?" in path or "#" in path:
        return "'?' and '#' (URL query or fragment) are refused"
    if ":" in path:
        return "':' (a URL scheme or drive letter) is refused"
    if path.startswith("/"):
        return "absolute paths are refused"
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return f"{'an empty' if not segment else repr(segment)} path segment is refused"
    return "refused"  # unreachable: every character the pattern refuses is named above


def check_grouped(grouped: Any, ext: Any, encoding: Any, where: str) -> None:
    """A field's ``grouped`` flag: None or a bool, and a grouped field reads from a ``.json``
    member of small values of the encodings that can be grouped."""
    if grouped is None or grouped is False:
        return
    if grouped is not True:
        raise InvalidField(f"{where}.grouped: expected true, false or null, got {grouped!r}")
    if not (isinstance(ext, str) and ext.endswith(".json")) or encoding not in GROUPABLE:
        raise InvalidField(
            f"{where}.grouped: a grouped field reads from a .json member (ext {ext!r}) and is "
            f"of an encoding in {GROUPABLE} (got {encoding!r})"
        )


GROUPABLE = ("cls", "json", "txt")
"""The encodings whose values may be grouped into one JSON member."""
