"""The WebDataset naming rule: ``KEY.EXT`` members, key up to the first dot of the basename."""

from __future__ import annotations

import re

_FIELD_RE = re.compile(r"^[a-z0-9_][a-z0-9_\-]*$")
MAX_KEY_BYTES = 80  # leaves room for ".field.ext" within the 100-byte ustar name


_META_RE = re.compile(r"__[^/]*__($|/)")


def is_metadata(name: str) -> bool:
    """Whether webdataset skips a member as metadata: a name ``__NAME__`` (no ``/``), or one
    that starts with such a folder or name (``__NAME__/...``); ``__a.txt`` is a sample member."""
    if not name.startswith("__"):
        return False
    return ("/" not in name and name.endswith("__")) or _META_RE.match(name) is not None


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, ext)`` of a member name, or None for members webdataset skips.

    The key is the directory part plus the basename up to its first dot; the extension is the
    rest, lower-cased. Names without a dot in the basename, basenames starting with a dot and
    metadata names (:func:`is_metadata`: ``__NAME__``, ``__NAME__/...``) are skipped, as
    webdataset does; a key may start with ``__`` (``__a.txt``: key ``__a``).
    """
    slash = name.rfind("/")
    base = name[slash + 1 :]
    dot = base.find(".")
    if dot <= 0 or (name[:2] == "__" and is_metadata(name)):
        return None
    return name[: slash + 1 + dot], base[dot + 1 :].lower()


def skip_reason(name: str) -> str:
    """Why :func:`split_name` skips ``name`` (it must be a name it skips)."""
    if is_metadata(name):
        return "a metadata name (__NAME__), which webdataset skips too"
    if name[name.rfind("/") + 1 :].startswith("."):
        return "a hidden name (starts with '.')"
    return "no extension (a sample member is named KEY.EXT)"


def validate_key(key: str) -> None:
    """Raise ValueError unless ``key`` is a valid sample key for shards we write."""
    if not key or "." in key or key[0] in "._" or "/" in key or "\0" in key:
        raise ValueError(
            f"invalid sample key {key!r}: keys must be non-empty, contain no '.', '/' or NUL "
            "and must not start with '.' or '_'"
        )
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"sample key {key!r} is longer than {MAX_KEY_BYTES} bytes")


def validate_field(field: str) -> None:
    """Raise ValueError unless ``field`` is a valid field name (lower-case, no dots)."""
    if not _FIELD_RE.match(field):
        raise ValueError(
            f"invalid field name {field!r}: use lower-case letters, digits, '_' or '-', "
            "no dots (WebDataset lower-cases extensions)"
        )


def member_ext(field: str, encoding: str) -> str:
    """The member extension of a field: ``field.encoding``, or ``encoding`` when they are equal."""
    return encoding if field == encoding else f"{field}.{encoding}"


def field_of_ext(ext: str) -> tuple[str, str]:
    """``(field, encoding)`` for a member extension: the inverse of :func:`member_ext`."""
    head, dot, last = ext.rpartition(".")
    if not dot:
        return ext, ext
    return head, last
