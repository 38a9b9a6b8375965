"""Random seeds for DataLoader workers and epochs.

:func:`worker_seed` derives one seed from ``(seed, epoch, rank, worker)`` (a hash, so nearby
tuples give unrelated seeds: seed 42 at epoch 1 is not seed 43 at epoch 0). :class:`WorkerSeeder`
is the ``worker_init_fn`` the loader factory installs: it seeds ``random``, numpy and torch in
each worker from that tuple, so no two workers draw the same numbers and a rerun draws the same
ones. :func:`seed_worker` is the usual reproducibility recipe's ``worker_init_fn`` (numpy and
``random`` from ``torch.initial_seed()``), for plain DataLoaders.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["WorkerSeeder", "epoch_generator", "seed_worker", "worker_seed"]


def worker_seed(seed: int, epoch: int, rank: int, worker: int) -> int:
    """A 63-bit seed that depends on all four numbers (never on the order they are used in)."""
    text = f"wdsloader.worker_seed:{int(seed)}:{int(epoch)}:{int(rank)}:{int(worker)}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A torch generator for the shuffle of ``epoch`` (the same on every rank)."""
    return torch.Generator().manual_seed(worker_seed(seed, epoch, -1, -1))


def seed_all(value: int) -> None:
    """Seed ``random``, numpy's global generator and torch's in this process."""
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def seed_worker(worker_id: int) -> None:
    """The usual ``worker_init_fn``: seed numpy and ``random`` from the worker's torch
    seed (``torch.initial_seed()``, which torch makes distinct per worker and derives from the
    DataLoader's ``generator``)."""
    value = torch.initial_seed() % 2**32
    np.random.seed(value)
    random.seed(value)


@dataclass(slots=True)
class WorkerSeeder:
    """``worker_init_fn`` seeding ``random``, numpy and torch from ``(seed, epoch, rank, worker)``.

    The loader that owns it updates ``epoch`` (``set_epoch``); a worker pool started for an
    epoch seeds itself from that epoch. Persistent workers are seeded once, when their pool
    starts, and continue their streams in later epochs (still distinct per worker, and the same
    on a rerun that starts from the same epoch). ``epoch=None`` reads the epoch from the
    worker's dataset (``dataset.epoch``; the shard loader's plan epoch).
    """

    seed: int
    rank: int = 0
    epoch: int | None = 0

    def __call__(self, worker_id: int) -> None:
        epoch = self.epoch
        if epoch is None:
            info = torch.utils.data.get_worker_info()
            epoch = int(getattr(info.dataset, "epoch", 0)) if info is not None else 0
        seed_all(worker_seed(self.seed, epoch, self.rank, worker_id))
