"""Loader state: the epoch and a plan :class:`~wdsloader.plan.Resume` chain, as plain data."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from wdsloader.plan import PlanConfig, Resume

STATE_FORMAT = "wdsloader.loader"
STATE_VERSION = 1
_TOPOLOGY = ("world_size", "num_workers", "batch_size", "drop_last", "window")
_IDENTITY = ("seed", "shuffle", "span")


def counts_digest(counts: tuple[int, ...]) -> str:
    """A short fingerprint of the per-shard sample counts."""
    return hashlib.sha256(",".join(map(str, counts)).encode()).hexdigest()[:16]


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


def make_state(split: str, epoch: int, config: PlanConfig, resume: Resume) -> dict[str, Any]:
    """A loader state dict (torchdata's ``state_dict`` protocol)."""
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
    }


def check_state(state: dict[str, Any], split: str, config: PlanConfig) -> None:
    """Raise ValueError unless ``state`` was saved by a loader over the same data and plan."""
    if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise ValueError("not a wdsloader loader state (format/version fields)")
    expected = {
        "split": split,
        **{name: getattr(config, name) for name in _IDENTITY},
        "counts_digest": counts_digest(config.counts),
    }
    wrong = [
        f"{k} saved={state.get(k)!r} now={v!r}" for k, v in expected.items() if state.get(k) != v
    ]
    if wrong:
        raise ValueError("the loader state belongs to a different plan: " + ", ".join(wrong))
