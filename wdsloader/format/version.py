"""The manifest's format version: what each version means, which this library reads, and the
messages for a manifest written by a newer wdsloader."""

from __future__ import annotations

from wdsloader.errors import ManifestError

__all__ = [
    "EXTENDED_VERSION",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "READ_VERSION",
    "SIDE_FILES_MINOR",
    "check_version",
    "newer_hint",
]

FORMAT_VERSION = "1.0"
"""The version written for a dataset that every wdsloader reads (no compressed shard, no
grouped field)."""
EXTENDED_VERSION = "2.0"
"""The version written for a dataset with compressed shards or grouped fields: a wdsloader
older than 2.0 refuses it with "upgrade wdsloader" instead of misreading it."""
SIDE_FILES_MINOR = 1
"""The minor version written when shards declare side files (``keys_path``, ``lengths_path``):
``1.1``/``2.1``. An older reader refuses such a manifest; this one, reading a newer minor it
cannot parse, says so ("upgrade wdsloader") instead of only naming the unknown key."""
READ_VERSION = "2.1"
"""The newest version this library reads."""
MANIFEST_NAME = "manifest.json"


def check_version(version: str, *, source: str = MANIFEST_NAME) -> None:
    """Refuse a manifest whose major format version is newer than this library reads."""
    try:
        major = _major(version)
    except ValueError:
        raise ManifestError(f"{source}: invalid format version {version!r}") from None
    if major > _major(READ_VERSION):
        raise ManifestError(
            f"{source}: format version {version} is newer than this wdsloader supports "
            f"({READ_VERSION}); upgrade wdsloader to read it"
        )


def newer_hint(version: str) -> str:
    """Said after a manifest's parse error when its ``version`` is newer than
    :data:`READ_VERSION` (a newer minor: keys this library does not know); else ``""``."""
    if (_major(version), _minor(version)) <= (_major(READ_VERSION), _minor(READ_VERSION)):
        return ""
    return (
        f" (format version {version} is newer than this wdsloader reads, {READ_VERSION}: "
        "upgrade wdsloader to read it)"
    )


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _minor(version: str) -> int:
    parts = version.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
