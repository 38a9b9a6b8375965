"""Loader state: the epoch and a plan :class:`~wdsloader.plan.Resume` chain, as plain data.

A state names the data it was taken on: the split, the per-shard sample counts and a digest of
the split's shards (path, sample count and sha256 from the manifest), so a state from another
dataset is refused instead of silently replayed over different samples.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from wdsloader.errors import StateMismatchError
from wdsloader.format import ShardInfo
from wdsloader.plan.sample_plan import PlanConfig, Resume

log = logging.getLogger(__name__)

STATE_FORMAT = "wdsloader.stream.loader"
STATE_VERSION = 1
_TOPOLOGY = ("world_size", "num_workers", "batch_size", "drop_last", "window")
_IDENTITY = ("seed", "shuffle", "span")
# the type of every key of a state (``shards_digest`` may be absent: states saved before it)
_STATE_TYPES: dict[str, type] = {
    "format": str,
    "version": int,
    "split": str,
    "epoch": int,
    "batches_done": int,
    "resume": dict,
    "seed": int,
    "shuffle": bool,
    "span": int,
    "num_samples": int,
    "counts_digest": str,
    "shards_digest": str,
}
_RESUME_TYPES: dict[str, type] = {
    "batches_done": int,
    **dict.fromkeys(_TOPOLOGY, int),
    "drop_last": bool,
}


def counts_digest(counts: tuple[int, ...]) -> str:
    """A short fingerprint of the per-shard sample counts."""
    return hashlib.sha256(",".join(map(str, counts)).encode()).hexdigest()[:16]


def shards_digest(shards: Sequence[ShardInfo]) -> str:
    """A short fingerprint of a split's shards: each one's path, sample count and sha256."""
    rows = [[s.path, s.num_samples, s.sha256] for s in shards]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def resume_to_dict(resume: Resume) -> dict[str, Any]:
    """A JSON-able form of a resume chain (the parts of each config that may differ)."""
    return {
        "batches_done": resume.batches_done,
        **{name: getattr(resume.config, name) for name in _TOPOLOGY},
        "prior": None if resume.prior is None else resume_to_dict(resume.prior),
    }


def resume_from_dict(data: dict[str, Any], config: PlanConfig) -> Resume:
    """The resume chain ``data`` describes, for a plan whose other fields are ``config``'s."""
    saved = replace(config, **{name: data[name] for name in _TOPOLOGY})
    prior = None if data.get("prior") is None else resume_from_dict(data["prior"], config)
    return Resume(saved, int(data["batches_done"]), prior)


def make_state(
    split: str, epoch: int, config: PlanConfig, resume: Resume, shards: str
) -> dict[str, Any]:
    """A loader state dict (torchdata's ``state_dict`` protocol); ``shards`` is the split's
    :func:`shards_digest`."""
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "split": split,
        "epoch": epoch,
        "batches_done": resume.batches_done,
        "resume": resume_to_dict(resume),
        **{name: getattr(config, name) for name in _IDENTITY},
        "num_samples": config.num_samples,
        "counts_digest": counts_digest(config.counts),
        "shards_digest": shards,
    }


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _check_types(data: Mapping[str, Any], types: Mapping[str, type], where: str) -> None:
    for key, kind in types.items():
        if key not in data:
            raise StateMismatchError(f"malformed loader state: key {where}{key!r} is missing")
        value = data[key]
        # bool is an int to Python; a state never means one for the other
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not ok:
            raise StateMismatchError(
                f"malformed loader state: {where}{key!r} should be {kind.__name__}, "
                f"got {_type_name(value)} ({value!r:.60})"
            )


def check_resume(data: object, where: str = "resume.") -> None:
    """Raise :class:`StateMismatchError` unless ``data`` is a well-formed resume chain."""
    if not isinstance(data, Mapping):
        key = where.rstrip(".")
        raise StateMismatchError(
            f"malformed loader state: {key!r} should be dict, got {_type_name(data)}"
        )
    _check_types(data, _RESUME_TYPES, where)
    if data.get("prior") is not None:
        check_resume(data["prior"], f"{where}prior.")


def check_state(state: object, split: str, config: PlanConfig, shards: str) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` is a well-formed state saved by a
    loader over the same shards (``shards``: their :func:`shards_digest`), split and plan; the
    message names the missing or mistyped key, or the part that differs."""
    if not isinstance(state, Mapping):
        raise StateMismatchError(
            f"a loader state is a dict (from state_dict()), got {_type_name(state)}"
        )
    if state.get("format") != STATE_FORMAT:
        raise StateMismatchError(
            f"not a wdsloader loader state: format {state.get('format')!r}, "
            f"expected {STATE_FORMAT!r}"
        )
    if state.get("version") != STATE_VERSION:
        raise StateMismatchError(
            f"loader state version {state.get('version')!r} is not supported "
            f"(this wdsloader reads version {STATE_VERSION})"
        )
    types = dict(_STATE_TYPES)
    if "shards_digest" not in state:
        del types["shards_digest"]
        log.warning(
            "the loader state has no shards digest (saved by an older wdsloader): it is "
            "checked against the shard counts only"
        )
    _check_types(state, types, "")
    check_resume(state["resume"])
    expected: dict[str, Any] = {
        "split": split,
        **{name: getattr(config, name) for name in _IDENTITY},
        "counts_digest": counts_digest(config.counts),
    }
    if "shards_digest" in state:
        expected["shards_digest"] = shards
    labels = {
        "counts_digest": "shard sample counts (counts_digest)",
        "shards_digest": "shards: paths or sha256 (shards_digest)",
    }
    wrong = [
        f"{labels.get(k, k)} saved={state[k]!r} now={v!r}"
        for k, v in expected.items()
        if state[k] != v
    ]
    if wrong:
        raise StateMismatchError(
            "the loader state was taken on other data or with another plan; differs: "
            + "; ".join(wrong)
        )
