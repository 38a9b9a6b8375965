"""The top-level keys of ``manifest.json``: which a manifest must have, which it may have."""

from __future__ import annotations

import logging
from typing import Any

from wdsloader.errors import ManifestError

TOP_LEVEL_KEYS = (
    "format", "version", "schema", "dims", "splits", "totals", "build", "loader_defaults"
)  # fmt: skip
"""The top-level keys of ``manifest.json``; a reader warns about others and ignores them."""
REQUIRED_KEYS = ("schema", "splits")
"""Keys a manifest must have besides ``format`` and ``version`` (without them a dataset would
read as empty)."""

log = logging.getLogger("wdsloader")


def check_top_level(data: dict[str, Any], source: str) -> None:
    """ManifestError naming ``source`` and the missing required keys; a logged warning naming
    the unknown keys."""
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise ManifestError(
            f"{source}: missing {', '.join(map(repr, missing))} (a manifest lists its fields "
            "under 'schema' and its shards under 'splits')"
        )
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        log.warning(
            "%s: unknown top-level key(s) %s ignored; known: %s",
            source, ", ".join(map(repr, unknown)), sorted(TOP_LEVEL_KEYS),
        )  # fmt: skip
