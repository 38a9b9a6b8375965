"""The stage fingerprint a loader state records: each stage's config as a short string
(:func:`stage_fingerprint`), and what the user functions among them do at the state's epoch
(:func:`epoch_fingerprint`), so a state is refused when resuming would put other samples
where the saved run put them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsloader.plan import PLAN_ALGORITHM

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum
    from wdsloader.mix.spec import MixSpec

__all__ = ["EPOCH_PARTS", "FINGERPRINT_PARTS", "epoch_fingerprint", "stage_fingerprint"]

# the parts of a stage fingerprint, in the order a mismatch lists them
FINGERPRINT_PARTS = ("plan", "fields", "decoder", "curriculum", "collate")
# the parts :func:`epoch_fingerprint` adds, with how a mismatch names them
EPOCH_PARTS = {
    "mix_weights": "the mix's weights function (the quotas it gives the saved epoch and the "
    "epochs before it)",
    "curriculum_schedule": "the curriculum's schedule function (its probabilities at the "
    "saved epoch)",
}


def _callable_name(fn: object) -> str:
    """``module.qualname`` of a function, or of an instance's class."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


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
    return f"{curriculum.output}:{_digest(text.encode())}"


def stage_fingerprint(
    *,
    fields: Sequence[str] | None,
    allow_pickle: bool,
    curriculum: Curriculum | None,
    collate: str | Callable[..., Any],
    mix: str | None = None,
    packing: str | None = None,
) -> dict[str, str]:
    """Each stage's config as a short string, one per :data:`FINGERPRINT_PARTS` entry.

    ``fields`` are the decoded fields (None: whatever the samples hold); ``collate`` is a
    registered collator's name or the callable itself. A collate callable is named only by
    module and qualname: it shapes each batch but does not choose which samples a batch holds,
    so a changed body under the same name is accepted. A curriculum schedule function is named
    the same way here, and compared by what it returns at the state's epoch by
    :func:`epoch_fingerprint`. Gathering and ``on_error`` are left out: they do not change which
    samples a batch holds. ``mix`` (a sample-level mix's
    :meth:`~wdsloader.mix.spec.MixSpec.fingerprint`) adds the part ``"mix"``, ``packing``
    (its options and a digest of the lengths) the part ``"packing"``.
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
    if packing is not None:
        out["packing"] = packing
    return out


def epoch_fingerprint(dataset: Any, epoch: int) -> dict[str, str]:
    """What the user functions of ``dataset`` (its ``mix`` and ``curriculum``) do at ``epoch``,
    one :data:`EPOCH_PARTS` entry per function (none without one).

    ``mix_weights``: a digest of the quotas a weights function gives ``epoch`` and the stream
    positions the epochs before it consumed (everything the mix plan of ``epoch`` takes from
    the weights). ``curriculum_schedule``: a digest of the probabilities a schedule function
    gives ``epoch``. A function saved and loaded under the same name but returning other values
    there then fails :meth:`~wdsloader.stream.state.LoaderState.check` instead of resuming onto
    other samples.
    """
    from wdsloader.curriculum.schedule import CallableSchedule

    out: dict[str, str] = {}
    mix: MixSpec | None = getattr(dataset, "mix", None)
    if mix is not None and isinstance(mix.weights, CallableSchedule):
        me = mix.epoch(epoch)
        plan = json.dumps([list(me.quotas), list(me.offsets)]).encode()
        out["mix_weights"] = f"epoch {epoch}:{_digest(plan)}"
    curriculum: Curriculum | None = getattr(dataset, "curriculum", None)
    if curriculum is not None and isinstance(curriculum.schedule, CallableSchedule):
        probs = np.ascontiguousarray(curriculum.probabilities(epoch), dtype="<f8")
        out["curriculum_schedule"] = f"epoch {epoch}:{_digest(probs.tobytes())}"
    return out
