"""The plan of packed rows: which documents (or pieces of them) every batch of every rank and
DataLoader worker packs, from the documents' lengths alone.

An epoch's packs do not depend on the topology: the documents in the epoch order
(:func:`~wdsloader.plan.order.epoch_order`: shards' spans permuted by seed and epoch) are packed
by :func:`~wdsloader.plan.packing.plan_packs` window by window, and (when shuffling) the packs of
each window are permuted by (seed, epoch, window). :class:`EpochPacks` holds them as flat arrays.

The packs are then dealt in rounds: batch ``j`` of rank ``r`` holds packs
``(j * world_size + r) * batch_size ..`` (``batch_size`` packs), and DataLoader worker ``w`` of
``W`` yields the rank's batches ``w, w + W, ...`` (the order torch's DataLoader returns them in).
So after every rank yielded ``k`` batches exactly the first ``k * world_size * batch_size`` packs
are consumed: a resume, exact or under another topology (elastic), continues with the packs that
follow, dealt over the topology in force. The last round: ``drop_last=True`` leaves out the
packs that do not fill one batch on every rank (their documents are not read this epoch);
``drop_last=False`` fills it with packs repeated from the first packs of the epoch (the
positions past the last pack wrap round, so an exact resume repeats the same ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from wdsloader.plan.config import PlanConfig, describe
from wdsloader.plan.order import epoch_order
from wdsloader.plan.packing import Pack, Packing, Piece, plan_packs
from wdsloader.plan.resume import Resume

__all__ = ["EpochPacks", "PackBatches", "PackPlanner", "epoch_packs", "packs_consumed"]

PACK_TAG = 0x9AC4_5EED  # mixed into the seed of the packs' shuffle: part of the resume contract


@dataclass(frozen=True, slots=True, eq=False)
class EpochPacks:
    """The packs of one epoch: pack ``i`` holds pieces ``ptr[i]:ptr[i + 1]``, each tokens
    ``start:stop`` of the document with split-wide sample id ``doc``."""

    doc: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    stop: npt.NDArray[np.int64]
    ptr: npt.NDArray[np.int64]

    @property
    def size(self) -> int:
        """The number of packs."""
        return len(self.ptr) - 1

    def pack(self, i: int) -> Pack:
        """Pack ``i`` as pieces whose ``doc`` is a split-wide sample id."""
        lo, hi = int(self.ptr[i]), int(self.ptr[i + 1])
        return tuple(
            Piece(int(d), int(a), int(b))
            for d, a, b in zip(self.doc[lo:hi], self.start[lo:hi], self.stop[lo:hi], strict=True)
        )

    def docs(self, packs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The documents of ``packs`` once each, in the order they first appear."""
        parts = [self.doc[self.ptr[i] : self.ptr[i + 1]] for i in packs.tolist()]
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        _, first = np.unique(ids, return_index=True)
        return ids[np.sort(first)]


def epoch_packs(
    config: PlanConfig, packing: Packing, lengths: npt.NDArray[np.integer], epoch: int
) -> EpochPacks:
    """The packs of ``epoch`` (see the module's text): a pure function of the documents'
    ``lengths`` (by split-wide sample id), ``packing``, and the seed, shuffle and span of
    ``config`` (not its topology)."""
    if len(lengths) != config.num_samples:
        raise ValueError(
            f"{len(lengths)} lengths for a split of {config.num_samples} samples: "
            "one length per sample"
        )
    order = epoch_order(config, epoch)
    lens = np.asarray(lengths, dtype=np.int64)[order]
    doc, start, stop, sizes = [], [], [], []
    for w, lo in enumerate(range(0, len(order), packing.window)):
        packs = plan_packs(
            lens[lo : lo + packing.window], packing.max_tokens,
            window=packing.window, too_long=packing.too_long,
        )  # fmt: skip
        if config.shuffle:
            rng = np.random.default_rng([config.seed, epoch, PACK_TAG, w])
            packs = [packs[i] for i in rng.permutation(len(packs))]
        for pack in packs:
            sizes.append(len(pack))
            for piece in pack:
                doc.append(int(order[lo + piece.doc]))
                start.append(piece.start)
                stop.append(piece.stop)
    ptr = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=ptr[1:])
    return EpochPacks(
        np.asarray(doc, np.int64), np.asarray(start, np.int64), np.asarray(stop, np.int64), ptr
    )


def run_batches(cfg: PlanConfig, remaining: int) -> int:
    """Batches every rank yields when ``remaining`` packs are dealt under ``cfg``."""
    per_round = cfg.world_size * cfg.batch_size
    return remaining // per_round if cfg.drop_last else -(-remaining // per_round)


def packs_consumed(resume: Resume | None, total: int) -> int:
    """The packs of an epoch of ``total`` packs consumed at ``resume`` (its whole chain): each
    run took ``batches_done`` rounds of its topology from the packs the runs before it left. A
    ValueError when a run claims more batches than it had."""
    if resume is None:
        return 0
    done = packs_consumed(resume.prior, total)
    cfg, k = resume.config, resume.batches_done
    have = run_batches(cfg, total - done)
    if k > have:
        raise ValueError(f"batches_done={k} exceeds the {have} batches per rank of {describe(cfg)}")
    return min(total, done + k * cfg.world_size * cfg.batch_size)


class PackBatches(Sequence[npt.NDArray[np.int64]]):
    """The batches one DataLoader worker yields: item ``i`` is the documents (split-wide sample
    ids, each once) of the worker's ``i``-th batch; :meth:`layout` is its packs."""

    def __init__(
        self, packs: EpochPacks, cfg: PlanConfig, rank: int, worker: int, offset: int
    ) -> None:
        self.packs, self.cfg, self.rank, self.worker, self.offset = packs, cfg, rank, worker, offset
        self.remaining = packs.size - offset
        self.batches = run_batches(cfg, self.remaining)  # of the rank, from ``offset``
        self._len = max(0, -(-(self.batches - worker) // cfg.num_workers))

    def __len__(self) -> int:
        return self._len

    def pack_ids(self, i: int) -> npt.NDArray[np.int64]:
        """The positions among the epoch's packs of the worker's ``i``-th batch."""
        if not 0 <= i < self._len:
            raise IndexError(f"batch {i} out of range ({self._len} batches)")
        cfg = self.cfg
        j = self.worker + i * cfg.num_workers  # the rank's batch
        first = (j * cfg.world_size + self.rank) * cfg.batch_size
        return (self.offset + first + np.arange(cfg.batch_size, dtype=np.int64)) % self.packs.size

    def layout(self, i: int) -> list[Pack]:
        """The packs (rows) of the worker's ``i``-th batch; a piece's ``doc`` is a split-wide
        sample id."""
        return [self.packs.pack(int(p)) for p in self.pack_ids(i)]

    @overload
    def __getitem__(self, index: int) -> npt.NDArray[np.int64]: ...

    @overload
    def __getitem__(self, index: slice) -> list[npt.NDArray[np.int64]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> npt.NDArray[np.int64] | list[npt.NDArray[np.int64]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        i = index + self._len if index < 0 else index
        return self.packs.docs(self.pack_ids(i))


class PackPlanner:
    """The :class:`~wdsloader.plan.Planner` of packed batches (see the module's text):
    ``config`` is the plan's topology and identity, ``lengths`` each sample's length of
    ``packing.field``. An epoch's packs are computed once per process and kept (the last two)."""

    def __init__(
        self, config: PlanConfig, packing: Packing, lengths: npt.NDArray[np.integer]
    ) -> None:
        self.config, self.packing = config, packing
        self.lengths = np.asarray(lengths, dtype=np.uint32)
        self._cache: dict[int, EpochPacks] = {}

    def __getstate__(self) -> dict[str, object]:
        return {"config": self.config, "packing": self.packing, "lengths": self.lengths}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._cache = {}

    def epoch_packs(self, epoch: int) -> EpochPacks:
        """:func:`epoch_packs` of ``epoch``."""
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(next(iter(self._cache)))
            self._cache[epoch] = epoch_packs(self.config, self.packing, self.lengths, epoch)
        return self._cache[epoch]

    def _offset(self, epoch: int, resume: Resume | None) -> tuple[EpochPacks, int]:
        packs = self.epoch_packs(epoch)
        return packs, packs_consumed(resume, packs.size)

    def num_batches(self, epoch: int, resume: Resume | None = None) -> int:
        """Batches every rank yields in ``epoch`` (from ``resume`` on)."""
        packs, offset = self._offset(epoch, resume)
        return run_batches(self.config, packs.size - offset)

    def padding(self, epoch: int) -> int:
        """Packed rows repeated in ``epoch`` so every rank gets the same batches."""
        size = self.epoch_packs(epoch).size
        rows = run_batches(self.config, size) * self.config.world_size * self.config.batch_size
        return max(0, rows - size)

    def dropped(self, epoch: int) -> int:
        """Packed rows left out of ``epoch`` (their documents not read) so every batch is full."""
        size = self.epoch_packs(epoch).size
        rows = run_batches(self.config, size) * self.config.world_size * self.config.batch_size
        return max(0, size - rows)

    def worker_batches(
        self, epoch: int, rank: int, worker: int, resume: Resume | None
    ) -> PackBatches:
        """The batches of DataLoader worker ``worker`` of ``rank`` in ``epoch`` (from
        ``resume`` on)."""
        if not 0 <= rank < self.config.world_size:
            raise ValueError(f"rank must be < world_size={self.config.world_size}, got {rank}")
        if not 0 <= worker < self.config.num_workers:
            raise ValueError(
                f"worker must be < num_workers={self.config.num_workers}, got {worker}"
            )
        packs, offset = self._offset(epoch, resume)
        return PackBatches(packs, self.config, rank, worker, offset)
