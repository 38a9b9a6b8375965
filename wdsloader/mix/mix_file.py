"""A :class:`~wdsloader.Mix` as a small JSON document, so that the training config and
``wdsloader replay --mix mix.json`` build the same mix::

    {"sources": [{"url": "s3://b/wiki", "name": "wiki", "weight": 0.7},
                 {"url": "s3://b/code", "weight": 0.3}],
     "epoch_samples": 100000, "unit": "samples", "batching": "mixed",
     "weights": {"kind": "linear", "start": {...}, "end": {...}, "epochs": 10}}

A source is a URL string or an object with ``url`` and at most one of ``weight``, ``samples``
or ``repeat`` (and ``name``); the other keys are :class:`~wdsloader.Mix`'s options, ``weights``
a schedule as :meth:`~wdsloader.curriculum.schedule.Schedule.to_dict` writes it. Storage
options (credentials) never go in the file: they are given where the mix is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from wdsloader.curriculum.schedule import schedule_from_dict
from wdsloader.mix.options import Mix
from wdsloader.mix.source import MixSource

__all__ = ["load_mix", "mix_from_dict", "mix_to_dict"]

SOURCE_KEYS = ("url", "name", "weight", "samples", "repeat")
OPTION_KEYS = ("weights", "epoch_samples", "batching", "source_field", "unit", "epoch_tokens")


def mix_from_dict(data: object, where: str = "mix spec") -> Mix:
    """The :class:`~wdsloader.Mix` that ``data`` (the JSON document above) describes; a
    ValueError names ``where`` and the unknown or missing key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"sources", *OPTION_KEYS})
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {['sources', *OPTION_KEYS]}")
    rows = data.get("sources")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: 'sources' must be a non-empty list of sources")
    sources = [_source(row, f"{where}: sources[{i}]") for i, row in enumerate(rows)]
    options = {k: data[k] for k in OPTION_KEYS if k in data}
    try:
        if options.get("weights") is not None:
            options["weights"] = schedule_from_dict(options["weights"])
        return Mix(sources, **options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _source(row: object, where: str) -> MixSource:
    if isinstance(row, str):
        row = {"url": row}
    if not isinstance(row, Mapping) or not isinstance(row.get("url"), str):
        raise ValueError(f"{where}: expected a URL or an object with a 'url' string")
    unknown = sorted(set(row) - set(SOURCE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {list(SOURCE_KEYS)}")
    try:
        return MixSource(**row)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def mix_to_dict(mix: Mix) -> dict[str, Any]:
    """The JSON-able document of ``mix`` (:func:`mix_from_dict` inverts it); a schedule made
    from a function cannot be written (ValueError)."""
    sources = [
        {k: getattr(s, k) for k in SOURCE_KEYS if getattr(s, k) is not None} for s in mix.sources
    ]
    out: dict[str, Any] = {"sources": sources}
    for key, value in mix.spec_options().items():
        if value is not None:
            out[key] = value.to_dict() if key == "weights" else value
    return out


def load_mix(path: str | os.PathLike[str]) -> Mix:
    """The mix a JSON file holds (see the module docstring); a ValueError names the file."""
    where = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    return mix_from_dict(data, where)
