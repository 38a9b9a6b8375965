"""Which variant of a field each sample takes per epoch: schedules and :class:`Curriculum`."""

from wdsloader.curriculum.curriculum import Curriculum
from wdsloader.curriculum.schedule import (
    CallableSchedule,
    CosineSchedule,
    FixedSchedule,
    LinearSchedule,
    ProbLike,
    Schedule,
    StepsSchedule,
    ZeroDecaySchedule,
    cosine,
    fixed,
    from_callable,
    linear,
    schedule_from_dict,
    steps,
    zero_decay,
)

__all__ = [
    "CallableSchedule",
    "CosineSchedule",
    "Curriculum",
    "FixedSchedule",
    "LinearSchedule",
    "ProbLike",
    "Schedule",
    "StepsSchedule",
    "ZeroDecaySchedule",
    "cosine",
    "fixed",
    "from_callable",
    "linear",
    "schedule_from_dict",
    "steps",
    "zero_decay",
]
