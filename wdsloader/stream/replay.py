"""Which samples a training step held, from the plan alone: no data is read.

The plan is a pure function of (seed, epoch, topology), so the samples of batch ``step`` of a
rank are known before (or long after) it was read. DataLoader workers yield their batches in
turn (worker 0's first, worker 1's first, ..., then each one's second; a worker with no batch
left is passed over), which is the order :func:`step_ids` walks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wdsloader import plan

if TYPE_CHECKING:
    from wdsloader.stream.dataset import ShardStreamDataset


@dataclass(frozen=True, slots=True)
class StepSamples:
    """The samples of one batch: ``index[j]`` is sample ``j``'s position in its split (what
    ``ShardDataset(...)[i]`` reads back, and the batch's ``__index__``); reading several
    sources, ``source[j]`` is its source's position in the mix (``names`` names them)."""

    index: np.ndarray
    source: np.ndarray | None = None
    names: tuple[str, ...] = ()


def step_ids(
    dataset: ShardStreamDataset, epoch: int, step: int, resume: plan.Resume | None = None
) -> np.ndarray:
    """The split-wide sample ids of batch ``step`` (0-based, counted from the start of
    ``epoch``) of the dataset's rank, ``epoch`` played from ``resume`` (None: from its start).
    After an elastic resume (another topology) the steps before the resume point were another
    run's: a ValueError."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    first = 0
    if resume is not None and (resume.prior is not None or resume.config != dataset.config):
        first = _steps_before(resume)
        if step < first:
            raise ValueError(
                f"step {step} of epoch {epoch} was played before this loader's elastic resume "
                f"(at step {first}, under another world size, worker count or batch size): "
                "ask the loader that played it"
            )
    else:
        resume = None  # an exact resume plays the epoch's own batches
    workers = [dataset.worker_batches(epoch, w, resume) for w in range(dataset.config.num_workers)]
    total = sum(len(b) for b in workers)
    if step - first >= total:
        raise ValueError(
            f"epoch {epoch} has {first + total} batches on rank {dataset.rank}; step {step} is "
            "past its end"
        )
    worker, nth = _in_turn([len(b) for b in workers], step - first)
    return np.asarray(workers[worker][nth], dtype=np.int64)


def _steps_before(resume: plan.Resume) -> int:
    """The batches a rank yielded before the run that ``resume`` continues (its whole chain)."""
    done = 0
    link: plan.Resume | None = resume
    while link is not None:
        done += link.batches_done
        link = link.prior
    return done


def _in_turn(counts: Sequence[int], step: int) -> tuple[int, int]:
    """``(worker, its batch)`` of the ``step``-th batch when workers with ``counts`` batches
    yield in turn (a worker with none left is passed over); ``step`` < ``sum(counts)``."""
    left = np.asarray(counts, dtype=np.int64)
    rounds = 0
    while True:
        active = np.flatnonzero(left > rounds)
        # the rounds in which the same workers still have batches
        span = int(left[active].min()) - rounds
        if step < span * len(active):
            r, k = divmod(step, len(active))
            return int(active[k]), rounds + r
        step -= span * len(active)
        rounds += span


def step_samples(
    dataset: ShardStreamDataset, epoch: int, step: int, resume: plan.Resume | None = None
) -> StepSamples:
    """:func:`step_ids` as each sample's position in its split (and source, for a mix)."""
    ids = step_ids(dataset, epoch, step, resume)
    mix = dataset.mix
    if mix is None:
        return StepSamples(ids)
    offsets = mix.offsets
    source = np.searchsorted(offsets, ids, side="right") - 1
    return StepSamples(ids - offsets[source], source.astype(np.int64), mix.names)
