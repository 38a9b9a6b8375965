"""Hand a worker process's batch to the training process through one reused shared-memory block.

Without this, torch pickles every tensor of a batch by copying its storage into a new
shared-memory segment (each page of it faulted in afresh, on every batch) and sending one file
descriptor per tensor (each one a connection to the worker's resource sharer). A
:class:`BlockRing` instead copies the batch's tensors into one block of a small ring of
``memfd`` blocks, kept mapped and faulted in, and sends the block's descriptor once per batch;
the training process maps it and rebuilds the same dict of tensors (views of the mapping), and
the block goes back to the ring when no tensor of that batch is left in the training process.
A batch that is not a dict, holds no CPU tensor, or finds every block still in use
goes torch's way, unchanged.
"""

from __future__ import annotations

import mmap
import os
import weakref
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch

HEADER = 64  # bytes before the first tensor: the block's in-use flag (uint64), then padding
ALIGN = 64  # each tensor starts on this boundary
RING = 4  # blocks per worker: the batches torch prefetches, one being used, one being made


class BlockRing:
    """A worker process's shared-memory blocks, reused once the training process has dropped
    every tensor of the batch that a block carried."""

    def __init__(self, size: int = RING) -> None:
        self.size = size
        self.blocks: list[tuple[int, mmap.mmap, np.ndarray]] = []  # (fd, mapping, flag)
        self.allocated = 0  # blocks made
        self.packed = 0  # batches that went through a block

    def pack(self, batch: Any) -> Any:
        """``batch`` ready to be sent: a :class:`PackedBatch` when it is a dict holding CPU
        tensors and a free block exists (or may be made), else ``batch`` itself."""
        if not isinstance(batch, dict) or not hasattr(os, "memfd_create"):
            return batch
        places: dict[str, int] = {}
        end = HEADER
        for name, value in batch.items():
            if _movable(value):
                places[name] = end
                end += -(-value.numel() * value.element_size() // ALIGN) * ALIGN
        if not places:
            return batch
        block = self._free_block(end)
        if block is None:
            return batch
        fd, mapped, flag = block
        flag[0] = 1  # in use until the training process drops the batch
        data = np.frombuffer(mapped, dtype=np.uint8)
        specs = {}
        for name, start in places.items():
            value = batch[name]
            nbytes = value.numel() * value.element_size()
            dest = torch.from_numpy(data[start : start + nbytes]).view(value.dtype)
            dest.view(value.shape).copy_(value)
            specs[name] = (start, value.dtype, tuple(value.shape))
        rest = {k: v for k, v in batch.items() if k not in places}
        self.packed += 1
        return PackedBatch(reduction.DupFd(fd), len(mapped), specs, rest, list(batch))

    def _free_block(self, nbytes: int) -> tuple[int, mmap.mmap, np.ndarray] | None:
        """A block of at least ``nbytes`` that the training process no longer uses (blocks
        too small for it are freed), a new one while the ring has room, else None."""
        for i, block in enumerate(self.blocks):
            if block[2][0] == 0:
                if len(block[1]) >= nbytes:
                    return block
                self._close(self.blocks.pop(i))
                break
        if len(self.blocks) >= self.size:
            return None
        size = -(-nbytes * 9 // 8 // mmap.PAGESIZE) * mmap.PAGESIZE  # room for larger batches
        fd = os.memfd_create("wdsloader-batch", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # faulted in once, here
        mapped = mmap.mmap(fd, size, flags=flags)
        flag = np.frombuffer(mapped, dtype=np.uint64, count=1)
        self.blocks.append((fd, mapped, flag))
        self.allocated += 1
        return self.blocks[-1]

    @staticmethod
    def _close(block: tuple[int, mmap.mmap, np.ndarray]) -> None:
        os.close(block[0])  # the mapping goes with its last array

    def close(self) -> None:
        """Release every block (those the training process still maps stay valid there)."""
        while self.blocks:
            self._close(self.blocks.pop())


def _movable(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and not value.is_shared()
    )


class PackedBatch:
    """A batch on its way from a worker process: unpickled, it is the batch again (a dict,
    its tensors views of the block mapped in the receiving process)."""

    __slots__ = ("dupfd", "names", "rest", "size", "specs")

    def __init__(
        self,
        dupfd: Any,
        size: int,
        specs: dict[str, tuple[int, torch.dtype, tuple[int, ...]]],
        rest: dict[str, Any],
        names: list[str],
    ) -> None:
        self.dupfd, self.size, self.specs, self.rest, self.names = dupfd, size, specs, rest, names

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _unpack, (self.dupfd, self.size, self.specs, self.rest, self.names)


class _Lease:
    """The object every tensor of one received batch refers to; its collection marks the
    block free for the worker to reuse."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, data: np.ndarray) -> None:
        self.__array_interface__ = {
            "shape": (len(data),),
            "typestr": "|u1",
            "data": (data.ctypes.data, False),
            "version": 3,
        }


def _release(data: np.ndarray) -> None:
    data[:8].view(np.uint64)[0] = 0  # the mapping itself goes when ``data`` does


def _unpack(
    dupfd: Any,
    size: int,
    specs: dict[str, tuple[int, torch.dtype, tuple[int, ...]]],
    rest: dict[str, Any],
    names: list[str],
) -> dict[str, Any]:
    """The batch a :class:`PackedBatch` carries, in the receiving process."""
    fd = dupfd.detach()
    try:
        data = np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)
    finally:
        os.close(fd)
    lease = _Lease(data)
    weakref.finalize(lease, _release, data).atexit = False
    whole = torch.from_numpy(np.asarray(lease))
    out: dict[str, Any] = {}
    for name in names:
        if name in rest:
            out[name] = rest[name]
            continue
        start, dtype, shape = specs[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out[name] = whole[start : start + nbytes].view(dtype).view(shape)
    return out
