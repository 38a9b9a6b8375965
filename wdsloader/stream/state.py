"""Loader state: one frozen :class:`LoaderState` (epoch, resume point, what it was taken on) and
its JSON-able dict form.

A state names what it was taken on: the split, the per-shard sample counts, a digest of the
split's shards (path, sample count and sha256 from the manifest), the plan's identity (seed,
shuffle, span) and a fingerprint of every stage's config (plan algorithm, fields, decoder,
curriculum, collator), so a state from another dataset or pipeline is refused instead of
silently replayed over other samples. The topology (world size, workers, batch size, drop_last,
shuffle window) may differ: the plan re-plans the samples not yet consumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from wdsloader.errors import StateMismatchError
from wdsloader.format import ShardInfo
from wdsloader.plan import PLAN_ALGORITHM, PlanConfig, Resume, num_batches

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum

log = logging.getLogger(__name__)

STATE_FORMAT = "wdsloader.stream.loader"
STATE_VERSION = 1
_TOPOLOGY = ("world_size", "num_workers", "batch_size", "drop_last", "window")
_IDENTITY = ("seed", "shuffle", "span")
# the parts of a stage fingerprint, in the order a mismatch lists them
FINGERPRINT_PARTS = ("plan", "fields", "decoder", "curriculum", "collate")
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


def counts_digest(counts: tuple[int, ...]) -> str:
    """A short fingerprint of the per-shard sample counts."""
    return hashlib.sha256(",".join(map(str, counts)).encode()).hexdigest()[:16]


def shards_digest(shards: Sequence[ShardInfo]) -> str:
    """A short fingerprint of a split's shards: each one's path, sample count and sha256."""
    rows = [[s.path, s.num_samples, s.sha256] for s in shards]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _callable_name(fn: object) -> str:
    """``module.qualname`` of a function, or of an instance's class."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def _curriculum_part(curriculum: Curriculum | None) -> str:
    if curriculum is None:
        return "none"
    from wdsloader.curriculum.schedule import CallableSchedule

    if isinstance(curriculum.schedule, CallableSchedule):  # no dict form: name the function
        desc: dict[str, Any] = {
            "output": curriculum.output,
            "index_output": curriculum.index_output,
            "variants": list(curriculum.names),
            "schedule": _callable_name(curriculum.schedule.fn),
            "seed": curriculum.seed,
        }
    else:
        desc = curriculum.to_dict()
    text = json.dumps(desc, sort_keys=True, default=str)
    return f"{curriculum.output}:{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def stage_fingerprint(
    *,
    fields: Sequence[str] | None,
    allow_pickle: bool,
    curriculum: Curriculum | None,
    collate: str | Callable[..., Any],
    mix: str | None = None,
) -> dict[str, str]:
    """Each stage's config as a short string, one per :data:`FINGERPRINT_PARTS` entry.

    ``fields`` are the decoded fields (None: whatever the samples hold); ``collate`` is a
    registered collator's name or the callable itself (named by module and qualname). Gathering
    and ``on_error`` are left out: they do not change which samples a batch holds. ``mix`` (a
    sample-level mix's :meth:`~wdsloader.mix.spec.MixSpec.fingerprint`) adds the part ``"mix"``.
    """
    name, version = PLAN_ALGORITHM
    out = {
        "plan": f"{name}/{version}",
        "fields": "*" if fields is None else ",".join(sorted(fields)),
        "decoder": f"allow_pickle={bool(allow_pickle)}",
        "curriculum": _curriculum_part(curriculum),
        "collate": collate if isinstance(collate, str) else _callable_name(collate),
    }
    if mix is not None:
        out["mix"] = mix
    return out


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
        prior = None if resume.prior is None else cls.of(resume.prior)
        topo = {name: getattr(resume.config, name) for name in _TOPOLOGY}
        return cls(batches_done=resume.batches_done, prior=prior, **topo)

    def to_plan(self, config: PlanConfig) -> Resume:
        """The plan resume chain, for a plan whose other fields are ``config``'s (ValueError
        when the topology is not a valid plan)."""
        saved = replace(config, **{name: getattr(self, name) for name in _TOPOLOGY})
        prior = None if self.prior is None else self.prior.to_plan(config)
        return Resume(saved, self.batches_done, prior)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (also what reaches the workers through shared memory)."""
        return {
            "batches_done": self.batches_done,
            **{name: getattr(self, name) for name in _TOPOLOGY},
            "prior": None if self.prior is None else self.prior.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "resume.") -> ResumePoint:
        """The resume point ``data`` describes; :class:`StateMismatchError` names a missing or
        mistyped key."""
        if not isinstance(data, Mapping):
            key = where.rstrip(".")
            raise StateMismatchError(
                f"malformed loader state: {key!r} should be dict, got {_type_name(data)}"
            )
        _check_types(data, _RESUME_TYPES, where)
        prior = data.get("prior")
        return cls(
            batches_done=data["batches_done"],
            prior=None if prior is None else cls.from_dict(prior, f"{where}prior."),
            **{name: data[name] for name in _TOPOLOGY},
        )


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
        return resume


def resume_to_dict(resume: Resume) -> dict[str, Any]:
    """The JSON-able form of a plan resume chain (:meth:`ResumePoint.to_dict`)."""
    return ResumePoint.of(resume).to_dict()


def resume_from_dict(data: Mapping[str, Any], config: PlanConfig) -> Resume:
    """The plan resume chain ``data`` (from :func:`resume_to_dict`) describes under ``config``."""
    return ResumePoint.from_dict(data).to_plan(config)
