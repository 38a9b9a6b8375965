"""Hand a worker process's batch to the training process through reused shared-memory blocks.

Without this, torch pickles every tensor of a batch by copying its storage into a new
shared-memory segment (each page of it faulted in afresh, on every batch) and sending one file
descriptor per tensor (each one a connection to the worker's resource sharer). A
:class:`BlockRing` instead copies the batch's tensors into one block of a small ring of
``memfd`` blocks, kept mapped and faulted in, and sends each block's descriptor once: the
training process keeps the block mapped (no socket round trip, no ``mmap`` per batch);
an array a decoder made in a block the ring lent it (:mod:`wdsloader.batch_arrays`: decoded
images) is sent where it lies, without a copy. The training process maps the blocks and
rebuilds the same dict of tensors (views of the mappings); a block goes back to the ring when
no tensor of that batch is left in the training process. A batch that is not a dict, holds no
CPU tensor, or finds every block in use goes torch's way, unchanged.
"""

from __future__ import annotations

import itertools
import mmap
import os
import weakref
from collections.abc import Iterable
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch

HEADER = 64  # bytes before the first tensor: the block's in-use flag (uint64), then padding
ALIGN = 64  # each tensor starts on this boundary
RING = 4  # blocks per worker: the batches torch prefetches, one being used, one being made
LENT = 4  # more blocks per worker for arrays lent to decoders
Block = tuple[int, mmap.mmap, np.ndarray, int]  # (descriptor, mapping, in-use flag, serial)


class BlockRing:
    """A worker process's shared-memory blocks, reused once the training process has dropped
    every tensor of the batch that a block carried.

    A block's flag is 0 when free; a block holding a batch on its way (or in the training
    process) has a nonzero flag, which the training process sets back to 0; a block lent to
    a decoder has a token of its own until the batch is packed, or back to 0 when the lent
    array is dropped before that."""

    def __init__(self, size: int = RING, lent: int = LENT) -> None:
        self.size, self.lent_size = size, lent
        self.blocks: list[Block] = []  # the batches' blocks
        self.lent: list[Block] = []  # blocks lent to decoders
        self.allocated = 0  # blocks made
        self.packed = 0  # batches that went through blocks
        self._tokens = itertools.count(2)
        self._serials = itertools.count()
        self._sent: set[int] = set()  # serials of the blocks the training process has mapped
        self._dropped: list[int] = []  # serials of blocks closed since the last batch packed
        self.key = (os.getpid(), os.urandom(8))  # this ring, in the training process's maps

    def pack(self, batch: Any) -> Any:
        """``batch`` ready to be sent: a :class:`PackedBatch` when it is a dict holding CPU
        tensors and blocks for them are free (or may be made), else ``batch`` itself."""
        if not isinstance(batch, dict) or not hasattr(os, "memfd_create"):
            return batch
        found: dict[str, tuple[int, int]] = {}  # tensor name -> (lent block, offset)
        places: dict[str, int] = {}
        end = HEADER
        for name, value in batch.items():
            if not _movable(value):
                continue
            where = self._in_lent(value)
            if where is not None:
                found[name] = where
            else:
                places[name] = end
                end += -(-value.numel() * value.element_size() // ALIGN) * ALIGN
        if not places and not found:
            return batch
        blocks: list[Block] = []
        if places:
            block = self._free_block(self.blocks, end, self.size)
            if block is None:
                return batch
            block[2][0] = 1  # in use until the training process drops the batch
            blocks.append(block)
            data = np.frombuffer(block[1], dtype=np.uint8)
            for name, start in places.items():
                value = batch[name]
                dest = torch.from_numpy(data[start : start + _nbytes(value)]).view(value.dtype)
                dest.view(value.shape).copy_(value)
        specs = {
            n: (0, start, batch[n].dtype, tuple(batch[n].shape)) for n, start in places.items()
        }
        for name, (i, offset) in found.items():
            block = self.lent[i]
            if block not in blocks:
                block[2][0] = 1  # handed over: the training process frees it
                blocks.append(block)
            value = batch[name]
            specs[name] = (blocks.index(block), offset, value.dtype, tuple(value.shape))
        rest = {k: v for k, v in batch.items() if k not in specs}
        self.packed += 1
        sent = [self._handle(b) for b in blocks]
        dropped, self._dropped = self._dropped, []
        return PackedBatch((*self.key, dropped), sent, specs, rest, list(batch))

    def _handle(self, block: Block) -> tuple[int, Any, int]:
        """(serial, descriptor the first time the block is sent, else None, size)."""
        first = block[3] not in self._sent
        self._sent.add(block[3])
        return block[3], reduction.DupFd(block[0]) if first else None, len(block[1])

    def lend(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of a free lent block for a decoder's array, or None when none is free
        and no more may be made; the block is free again if the array is dropped unsent."""
        block = self._free_block(self.lent, HEADER + nbytes, self.lent_size)
        if block is None:
            return None
        token = next(self._tokens)
        block[2][0] = token
        data = np.frombuffer(block[1], dtype=np.uint8)[HEADER : HEADER + nbytes]
        lease = _Lease(data)
        weakref.finalize(lease, _unsent, block[2], token).atexit = False
        return np.asarray(lease)

    def _in_lent(self, value: torch.Tensor) -> tuple[int, int] | None:
        """(index in :attr:`lent`, offset) of a tensor that lies in a lent block, else None."""
        if not value.is_contiguous():
            return None
        ptr = value.data_ptr()
        for i, (_fd, mapped, flag, _serial) in enumerate(self.lent):
            base = flag.ctypes.data
            if flag[0] > 1 and base <= ptr and ptr + _nbytes(value) <= base + len(mapped):
                return i, ptr - base
        return None

    def _free_block(self, ring: list[Block], nbytes: int, most: int) -> Block | None:
        """A block of ``ring`` of at least ``nbytes`` that is free (a free one too small for
        it is freed), a new one while ``ring`` has fewer than ``most``, else None."""
        for i, block in enumerate(ring):
            if block[2][0] == 0:
                if len(block[1]) >= nbytes:
                    return block
                self._close(ring.pop(i))
                break
        if len(ring) >= most:
            return None
        size = -(-nbytes * 9 // 8 // mmap.PAGESIZE) * mmap.PAGESIZE  # room for larger batches
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # faulted in once, here
        try:
            fd = os.memfd_create("wdsloader-batch", os.MFD_CLOEXEC)
        except OSError:  # no descriptor or memory left for one: torch's way
            return None
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size, flags=flags)
        except OSError:
            os.close(fd)
            return None
        flag = np.frombuffer(mapped, dtype=np.uint64, count=1)
        ring.append((fd, mapped, flag, next(self._serials)))
        self.allocated += 1
        return ring[-1]

    def _close(self, block: Block) -> None:
        os.close(block[0])  # the mapping goes with its last array
        if block[3] in self._sent:
            self._dropped.append(block[3])  # the training process unmaps it

    def close(self) -> None:
        """Release every block (those the training process still maps stay valid there)."""
        for ring in (self.blocks, self.lent):
            while ring:
                self._close(ring.pop())


def _nbytes(value: torch.Tensor) -> int:
    return value.numel() * value.element_size()


def _movable(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and not value.is_shared()
    )


def _unsent(flag: np.ndarray, token: int) -> None:
    """A lent array was dropped: its block is free unless it was sent (or lent again)."""
    if flag[0] == token:
        flag[0] = 0


Spec = tuple[int, int, torch.dtype, tuple[int, ...]]  # (block, offset, dtype, shape)
Ring = tuple[int, bytes, list[int]]  # (worker pid, ring token, serials of closed blocks)
Sent = tuple[int, Any, int]  # (serial, descriptor or None, size)


class PackedBatch:
    """A batch on its way from a worker process: unpickled, it is the batch again (a dict,
    its tensors views of the blocks mapped in the receiving process)."""

    __slots__ = ("blocks", "names", "rest", "ring", "specs")

    def __init__(
        self,
        ring: Ring,
        blocks: list[Sent],
        specs: dict[str, Spec],
        rest: dict[str, Any],
        names: list[str],
    ) -> None:
        self.ring, self.blocks, self.specs, self.rest, self.names = ring, blocks, specs, rest, names

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _unpack, (self.ring, self.blocks, self.specs, self.rest, self.names)


class _Lease:
    """The object every tensor of one batch in one mapped block refers to; its collection
    frees the block (in the training process: for the worker to reuse)."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, data: np.ndarray) -> None:
        self.__array_interface__ = {
            "shape": (len(data),),
            "typestr": "|u1",
            "data": (data.ctypes.data, False),
            "version": 3,
        }


def _release(data: np.ndarray) -> None:
    data[:8].view(np.uint64)[0] = 0


# the training process's mappings of its workers' blocks: pid -> (ring token, serial -> block)
_MAPS: dict[int, tuple[bytes, dict[int, np.ndarray]]] = {}


def forget(pids: Iterable[int]) -> None:
    """Unmap the blocks of the worker processes ``pids`` (their iterator is gone) once no
    tensor refers to them."""
    for pid in pids:
        _MAPS.pop(pid, None)


def _mapped(maps: dict[int, np.ndarray], sent: Sent) -> torch.Tensor:
    """A block sent by a worker, mapped here (the first time it comes): a uint8 tensor over it
    that frees the block when nothing refers to it any more."""
    serial, dupfd, size = sent
    if dupfd is not None:
        fd = dupfd.detach()
        try:
            maps[serial] = np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)
        finally:
            os.close(fd)
    data = maps.get(serial)
    if data is None:
        raise RuntimeError(f"a worker sent a batch in block {serial}, which was never mapped")
    lease = _Lease(data)
    weakref.finalize(lease, _release, data).atexit = False
    return torch.from_numpy(np.asarray(lease))


def _unpack(
    ring: Ring, blocks: list[Sent], specs: dict[str, Spec], rest: dict[str, Any], names: list[str]
) -> dict[str, Any]:
    """The batch a :class:`PackedBatch` carries, in the receiving process."""
    pid, token, dropped = ring
    entry = _MAPS.get(pid)
    if entry is None or entry[0] != token:  # the worker's first batch of a new pass
        entry = _MAPS[pid] = (token, {})
    for serial in dropped:
        entry[1].pop(serial, None)
    whole = [_mapped(entry[1], sent) for sent in blocks]
    out: dict[str, Any] = {}
    for name in names:
        if name in rest:
            out[name] = rest[name]
            continue
        block, start, dtype, shape = specs[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out[name] = whole[block][start : start + nbytes].view(dtype).view(shape)
    return out
