"""Loader state: one frozen :class:`LoaderState` (epoch, resume point, what it was taken on) and
its JSON-able dict form.

A state names what it was taken on: the split, the per-shard sample counts, a digest of the
split's shards (path, sample count and sha256 from the manifest), the plan's identity (seed,
shuffle, span) and a fingerprint of every stage's config (plan algorithm, fields, decoder,
curriculum, collator), so a state from another dataset or pipeline is refused instead of
silently replayed over other samples. The topology (world size, workers, batch size, drop_last,
shuffle window) may differ: the plan re-plans the samples not yet consumed. Every number of a
state is bounded and its chain of elastic resumes capped: a tampered one is refused by its key.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from wdsloader.errors import StateMismatchError
from wdsloader.format import ShardInfo
from wdsloader.plan import PlanConfig, Resume, num_batches
from wdsloader.plan.config import MAX_SEED
from wdsloader.stream.fingerprint import (
    EPOCH_PARTS,
    FINGERPRINT_PARTS,
    epoch_fingerprint,
    stage_fingerprint,
)

__all__ = [
    "LoaderState",
    "ResumePoint",
    "counts_digest",
    "epoch_fingerprint",
    "resume_from_dict",
    "resume_to_dict",
    "shards_digest",
    "stage_fingerprint",
]

log = logging.getLogger(__name__)

STATE_FORMAT = "wdsloader.stream.loader"
STATE_VERSION = 1
_TOPOLOGY = ("world_size", "num_workers", "batch_size", "drop_last", "window")
_IDENTITY = ("seed", "shuffle", "span")
# the type of every key of a state (``shards_digest`` and ``fingerprint`` may be absent: states
# saved before they were recorded)
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
    "fingerprint": dict,
}
_OPTIONAL = {
    "shards_digest": "no shards digest (saved by an older wdsloader): it is checked against "
    "the shard counts only",
    "fingerprint": "no stage fingerprint (saved by an older wdsloader): fields, decoder, "
    "curriculum and collator are not checked",
}
# every state saved before the stage fingerprint was recorded comes from this plan version
PLAN_BEFORE_FINGERPRINT = "span-permutation/1"
_RESUME_TYPES: dict[str, type] = {
    "batches_done": int,
    **dict.fromkeys(_TOPOLOGY, int),
    "drop_last": bool,
}
INT64_MAX = 2**63 - 1
# The bounds of every number of a state, far beyond any real run: a tampered value is refused
# naming its key instead of reaching the plan (allocations per rank and worker, int64 arrays).
# The seed is compared with the loader's own instead.
MAX_WORLD_SIZE = 2**24  # ranks; also the bound of world_size * num_workers (plan workers)
MAX_NUM_WORKERS = 2**16  # DataLoader workers per rank
MAX_BATCH_SIZE = 2**32
MAX_EPOCH = 2**62  # the next epoch, and seeds derived from it, stay within int64
MAX_RESUME_CHAIN = 256  # elastic resumes (topology changes) within one epoch
_BOUNDS: dict[str, tuple[int, int]] = {
    "version": (0, INT64_MAX),
    "epoch": (0, MAX_EPOCH),
    "batches_done": (0, INT64_MAX),
    "seed": (0, MAX_SEED),
    "span": (1, INT64_MAX),
    "num_samples": (0, INT64_MAX),
    "world_size": (1, MAX_WORLD_SIZE),
    "num_workers": (1, MAX_NUM_WORKERS),
    "batch_size": (1, MAX_BATCH_SIZE),
    "window": (0, INT64_MAX),
}


def counts_digest(counts: tuple[int, ...]) -> str:
    """A short fingerprint of the per-shard sample counts."""
    return hashlib.sha256(",".join(map(str, counts)).encode()).hexdigest()[:16]


def shards_digest(shards: Sequence[ShardInfo]) -> str:
    """A short fingerprint of a split's shards: each one's path, sample count and sha256."""
    rows = [[s.path, s.num_samples, s.sha256] for s in shards]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


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
        if kind is int and key in _BOUNDS:
            lo, hi = _BOUNDS[key]
            if not lo <= value <= hi:
                shown = repr(value) if value.bit_length() <= 128 else f"{value.bit_length()} bits"
                raise StateMismatchError(
                    f"malformed loader state: {where}{key!r} = {shown} is out of bounds "
                    f"(from {lo} to {hi})"
                )


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """A plan :class:`~wdsloader.plan.Resume` chain without the parts every config of a state
    shares (counts, seed, shuffle, span): the topology of each run and its batches."""

    batches_done: int
    world_size: int
    num_workers: int
    batch_size: int
    drop_last: bool
    window: int
    prior: ResumePoint | None = None

    @classmethod
    def of(cls, resume: Resume) -> ResumePoint:
        """The resume point of a plan resume chain."""
        chain: list[Resume] = []
        link: Resume | None = resume
        while link is not None:
            chain.append(link)
            link = link.prior
        out: ResumePoint | None = None
        for r in reversed(chain):
            topo = {name: getattr(r.config, name) for name in _TOPOLOGY}
            out = cls(batches_done=r.batches_done, prior=out, **topo)
        assert out is not None
        return out

    def chain(self) -> list[ResumePoint]:
        """This point and its priors, the latest first."""
        out: list[ResumePoint] = []
        link: ResumePoint | None = self
        while link is not None:
            out.append(link)
            link = link.prior
        return out

    def to_plan(self, config: PlanConfig) -> Resume:
        """The plan resume chain, for a plan whose other fields are ``config``'s (ValueError
        when the topology is not a valid plan)."""
        out: Resume | None = None
        for point in reversed(self.chain()):
            saved = replace(config, **{name: getattr(point, name) for name in _TOPOLOGY})
            out = Resume(saved, point.batches_done, out)
        assert out is not None
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (also what reaches the workers through shared memory)."""
        out: dict[str, Any] | None = None
        for point in reversed(self.chain()):
            out = {
                "batches_done": point.batches_done,
                **{name: getattr(point, name) for name in _TOPOLOGY},
                "prior": out,
            }
        assert out is not None
        return out

    @classmethod
    def from_dict(cls, data: object, where: str = "resume.") -> ResumePoint:
        """The resume point ``data`` describes; :class:`StateMismatchError` names a missing,
        mistyped or out-of-bounds key, or a chain of more than :data:`MAX_RESUME_CHAIN`."""
        rows: list[Mapping[str, Any]] = []
        base = where
        while data is not None:
            if len(rows) == MAX_RESUME_CHAIN:
                raise StateMismatchError(
                    f"malformed loader state: {base.rstrip('.')!r} is a chain of more than "
                    f"{MAX_RESUME_CHAIN} elastic resumes within one epoch"
                )
            if not isinstance(data, Mapping):
                raise StateMismatchError(
                    f"malformed loader state: {where.rstrip('.')!r} should be dict, "
                    f"got {_type_name(data)}"
                )
            _check_types(data, _RESUME_TYPES, where)
            plan_workers = data["world_size"] * data["num_workers"]
            if plan_workers > MAX_WORLD_SIZE:
                raise StateMismatchError(
                    f"malformed loader state: {where}'world_size' * {where}'num_workers' = "
                    f"{plan_workers} is above the bound {MAX_WORLD_SIZE}"
                )
            rows.append(data)
            depth = len(rows)
            where = base + ("prior." * depth if depth <= 3 else f"prior(depth {depth}).")
            data = data.get("prior")
        out: ResumePoint | None = None
        for row in reversed(rows):
            out = cls(
                batches_done=row["batches_done"],
                prior=out,
                **{name: row[name] for name in _TOPOLOGY},
            )
        if out is None:
            raise StateMismatchError(
                f"malformed loader state: {where.rstrip('.')!r} should be dict, got None"
            )
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderState:
    """Where a loader stands: the epoch and the batches every rank yielded in it (``resume``),
    and what the state was taken on (split, plan identity, data digests, stage fingerprint).

    ``shards_digest`` and ``fingerprint`` are None for states saved before they were recorded.
    """

    split: str
    epoch: int
    resume: ResumePoint
    seed: int
    shuffle: bool
    span: int
    num_samples: int
    counts_digest: str
    shards_digest: str | None = None
    fingerprint: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def capture(
        cls,
        *,
        split: str,
        epoch: int,
        config: PlanConfig,
        resume: Resume,
        shards: str,
        fingerprint: Mapping[str, str],
    ) -> LoaderState:
        """The state of a loader over ``split`` (``shards``: its :func:`shards_digest`) under
        ``config`` that stands at ``resume`` of ``epoch``."""
        return cls(
            split=split,
            epoch=epoch,
            resume=ResumePoint.of(resume),
            **{name: getattr(config, name) for name in _IDENTITY},
            num_samples=config.num_samples,
            counts_digest=counts_digest(config.counts),
            shards_digest=shards,
            fingerprint=tuple(fingerprint.items()),
        )

    @property
    def batches_done(self) -> int:
        """Batches every rank yielded since the last (re)plan of the epoch."""
        return self.resume.batches_done

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict (torchdata's ``state_dict`` protocol)."""
        data: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "split": self.split,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "resume": self.resume.to_dict(),
            **{name: getattr(self, name) for name in _IDENTITY},
            "num_samples": self.num_samples,
            "counts_digest": self.counts_digest,
        }
        if self.shards_digest is not None:
            data["shards_digest"] = self.shards_digest
        if self.fingerprint is not None:
            data["fingerprint"] = dict(self.fingerprint)
        return data

    @classmethod
    def from_dict(cls, state: object) -> LoaderState:
        """The state a :meth:`to_dict` result (also of an older wdsloader) describes;
        :class:`StateMismatchError` names the missing or mistyped key."""
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
        for key, missing in _OPTIONAL.items():
            if key not in state:
                del types[key]
                log.warning("the loader state has %s", missing)
        _check_types(state, types, "")
        resume = ResumePoint.from_dict(state["resume"])
        if state["batches_done"] != resume.batches_done:
            raise StateMismatchError(
                f"malformed loader state: 'batches_done' = {state['batches_done']} and "
                f"'resume.batches_done' = {resume.batches_done} should be equal"
            )
        fingerprint = state.get("fingerprint")
        if fingerprint is not None:
            bad = [k for k, v in fingerprint.items() if not isinstance(v, str)]
            if bad:
                raise StateMismatchError(
                    f"malformed loader state: 'fingerprint.{bad[0]}' should be str, "
                    f"got {_type_name(fingerprint[bad[0]])}"
                )
            fingerprint = tuple(fingerprint.items())
        return cls(
            split=state["split"],
            epoch=state["epoch"],
            resume=resume,
            **{name: state[name] for name in _IDENTITY},
            num_samples=state["num_samples"],
            counts_digest=state["counts_digest"],
            shards_digest=state.get("shards_digest"),
            fingerprint=fingerprint,
        )

    def check(
        self, *, split: str, config: PlanConfig, shards: str, fingerprint: Mapping[str, str]
    ) -> None:
        """Raise :class:`StateMismatchError` unless this state was taken over the same shards,
        split, plan identity and stage configs; the message names every part that differs."""
        saved_plan = PLAN_BEFORE_FINGERPRINT
        if self.fingerprint is not None:
            saved_plan = dict(self.fingerprint).get("plan", PLAN_BEFORE_FINGERPRINT)
        if saved_plan != fingerprint.get("plan"):
            raise StateMismatchError(
                f"the plan version differs: the loader state was saved by plan {saved_plan!r} and "
                f"this wdsloader plans with {fingerprint.get('plan')!r}, where the same batches_done "
                "stands on other samples; finish the epoch with the wdsloader that saved the "
                "state, or start the epoch afresh without it"
            )
        labels = {
            "counts_digest": "shard sample counts (counts_digest)",
            "shards_digest": "shards: paths or sha256 (shards_digest)",
            **{part: f"{what} ({part})" for part, what in EPOCH_PARTS.items()},
        }
        pairs: list[tuple[str, Any, Any]] = [
            ("split", self.split, split),
            *((name, getattr(self, name), getattr(config, name)) for name in _IDENTITY),
            ("counts_digest", self.counts_digest, counts_digest(config.counts)),
        ]
        if self.shards_digest is not None:
            pairs.append(("shards_digest", self.shards_digest, shards))
        if self.fingerprint is not None:
            saved = dict(self.fingerprint)
            extra = (set(saved) | set(fingerprint)) - set(FINGERPRINT_PARTS)
            parts = [*FINGERPRINT_PARTS, *sorted(extra)]
            pairs += [(part, saved.get(part), fingerprint.get(part)) for part in parts]
        wrong = [
            f"{labels.get(k, k)} saved={was!r} now={now!r}" for k, was, now in pairs if was != now
        ]
        if wrong:
            raise StateMismatchError(
                "the loader state was taken on other data or with another plan; differs: "
                + "; ".join(wrong)
            )

    def plan_resume(
        self, config: PlanConfig, count: Callable[[int, Resume], int] | None = None
    ) -> Resume:
        """The plan resume chain of this state under ``config`` (checked against the plan, or
        by ``count(epoch, resume)``, the batches left, when given: :class:`StateMismatchError`
        when it cannot continue there)."""
        try:
            resume = self.resume.to_plan(config)
            if count is None:
                num_batches(config, epoch=self.epoch, resume=resume)  # validates the resume
            else:
                count(self.epoch, resume)
        except ValueError as exc:
            raise StateMismatchError(f"the loader state's resume point is invalid: {exc}") from exc
        if resume.config != config and len(self.resume.chain()) >= MAX_RESUME_CHAIN:
            # another topology adds a link: the next state saved could not be loaded
            saved = ", ".join(f"{k}={getattr(self.resume, k)!r}" for k in _TOPOLOGY)
            now = ", ".join(
                f"{k}={getattr(config, k)!r}"
                for k in _TOPOLOGY
                if getattr(config, k) != getattr(self.resume, k)
            )
            raise StateMismatchError(
                f"the loader state holds {MAX_RESUME_CHAIN} elastic resumes within epoch "
                f"{self.epoch}, the most a state may hold: resume it with {saved} (now {now}), "
                "or start the next epoch without it"
            )
        return resume


def resume_to_dict(resume: Resume) -> dict[str, Any]:
    """The JSON-able form of a plan resume chain (:meth:`ResumePoint.to_dict`)."""
    return ResumePoint.of(resume).to_dict()


def resume_from_dict(data: Mapping[str, Any], config: PlanConfig) -> Resume:
    """The plan resume chain ``data`` (from :func:`resume_to_dict`) describes under ``config``."""
    return ResumePoint.from_dict(data).to_plan(config)
