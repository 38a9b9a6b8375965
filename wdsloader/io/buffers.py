"""Read buffers with explicit ownership: handed out by a pool, taken back when nothing can see
them any more."""

from __future__ import annotations

import functools
import mmap
import weakref
from collections import deque
from typing import Any

import numpy as np


class _Lease:
    """The one object every array over a leased block refers to (numpy keeps the object an
    array was made from as its base, and every view, memoryview or tensor made from such an
    array keeps that array); its collection returns the block to its pool."""

    __slots__ = ("__array_interface__", "__weakref__", "block")

    def __init__(self, block: np.ndarray, nbytes: int) -> None:
        self.block = block
        self.__array_interface__: dict[str, Any] = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (block.ctypes.data, False),
            "version": 3,
        }


class BufferPool:
    """Read buffers, reused once nothing holds them.

    :meth:`lease` hands out a uint8 array over a block of the pool. The block returns to the
    pool when its lease (:class:`_Lease`) is unreachable, that is when no array, memoryview or
    tensor made from the handed-out array is left anywhere: a decoded value that is a view of
    the read bytes (a custom decoder may return one) keeps them from being overwritten for as
    long as anyone holds it. Correctness rests on reachability, which every Python guarantees;
    CPython's reference counting only makes the return prompt (as soon as the executor drops a
    batch's bytes when the values it yielded are copies). At most ``keep`` free blocks are
    kept; the others are freed. ``populate``: large blocks are faulted in when made, at once
    (for arrays that every use writes whole, such as batch arrays).
    """

    def __init__(self, keep: int = 2, small_pages: bool = False, populate: bool = False) -> None:
        self.keep = keep
        self.populate = populate
        # blocks of which only parts are written (a read buffer with holes where the batch
        # reader placed fields): mapped in small pages, so that the holes take no memory
        self.small_pages = small_pages
        # appended to by lease finalizers, which may run in any thread: deque operations are
        # atomic, and no lock is held that a finalizer running inside ``lease`` could wait on
        self._free: deque[np.ndarray] = deque()
        self.allocated = 0  # blocks allocated
        self.reused = 0  # leases served from a returned block

    def __reduce__(self) -> tuple[type[BufferPool], tuple[int, bool, bool]]:
        """A copy is an empty pool (a dataset sent to a worker process takes no buffers)."""
        return BufferPool, (self.keep, self.small_pages, self.populate)

    def lease(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` (contents undefined) that is this caller's until
        nothing refers to it: the smallest free block that is large enough (the others stay
        free), or a new one when none is (the free blocks, all too small, are dropped)."""
        taken: list[np.ndarray] = []
        while True:  # pops: atomic against finalizers giving blocks back meanwhile
            try:
                taken.append(self._free.pop())
            except IndexError:
                break
        fits = [b for b in taken if len(b) >= nbytes]
        block = min(fits, key=len) if fits else None
        if block is None:
            block = _new_block(_rounded(nbytes), self.small_pages, self.populate)
            self.allocated += 1
        else:
            self._free.extend(b for b in reversed(taken) if b is not block)
            self.reused += 1
        lease = _Lease(block, nbytes)
        weakref.finalize(lease, self._give_back, block).atexit = False
        return np.asarray(lease)

    def _give_back(self, block: np.ndarray) -> None:
        if len(self._free) < self.keep:
            self._free.append(block)

    @property
    def free(self) -> int:
        """Blocks in the pool now, ready to be leased."""
        return len(self._free)


def _new_block(nbytes: int, small_pages: bool, populate: bool = False) -> np.ndarray:
    """A uint8 block, not zero-filled (numpy asks for huge pages for large arrays, where the
    system allows them). A large one with ``small_pages`` is an anonymous mapping in 4 KiB
    pages, each faulted in only when first written (the holes of a read buffer take no
    memory); with ``populate`` one in huge pages where the system has them
    (:func:`_huge_block`), else populated at once (``MAP_POPULATE``): a batch array every use
    writes whole, faulted in before the reads copy into it."""
    if nbytes < 2 * _HUGE_PAGE or not (small_pages or populate):
        return np.empty(nbytes, dtype=np.uint8)
    if small_pages:
        # private: a forked process writes its own copy of a free block, never the parent's
        # (and a private page faults in ~40% faster than a shared one)
        mapped = _anonymous(nbytes)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            mapped.madvise(mmap.MADV_NOHUGEPAGE)
    elif huge_pages():
        return _huge_block(nbytes)
    elif hasattr(mmap, "MAP_POPULATE"):
        mapped = mmap.mmap(-1, nbytes, flags=_PRIVATE | mmap.MAP_POPULATE)
    else:
        return np.empty(nbytes, dtype=np.uint8)
    return np.frombuffer(mapped, dtype=np.uint8)


def _huge_block(nbytes: int) -> np.ndarray:
    """``nbytes`` of private anonymous memory advised ``MADV_HUGEPAGE``, starting on a
    huge-page boundary: a 40 MiB batch array is faulted in by 20 faults instead of 10,240, and
    the copies into it miss the TLB far less often (measured here on 160 KiB blobs: ~10 ms of
    CPU to fault in and fill 40 MiB instead of ~50 with ``MAP_POPULATE`` in 4 KiB pages, ~5 ms
    to refill it instead of ~20). Advice refused leaves 4 KiB pages, faulted in by the
    copies."""
    # private: shared memory takes no THP advice; room to start on a boundary
    mapped = _anonymous(nbytes + _HUGE_PAGE)
    try:
        mapped.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass
    whole = np.frombuffer(mapped, dtype=np.uint8)
    start = -whole.ctypes.data % _HUGE_PAGE
    return whole[start : start + nbytes]


@functools.cache
def huge_pages() -> bool:
    """Whether this system backs memory advised ``MADV_HUGEPAGE`` with transparent huge pages
    (Linux with THP ``always`` or ``madvise``, not ``never``): large batch arrays then live in
    huge pages (:func:`_huge_block`). Read once, when the first large batch array is made."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


_HUGE_PAGE = 2 * 2**20
_PRIVATE = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)  # POSIX


def _anonymous(nbytes: int) -> mmap.mmap:
    """An anonymous mapping of ``nbytes``, private where the system has private mappings."""
    return mmap.mmap(-1, nbytes, flags=_PRIVATE) if _PRIVATE else mmap.mmap(-1, nbytes)


def _rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 steps per power of two (at most 1/8 more), so that a
    block serves the slightly larger requests that follow (groups of batches differ a little
    in size) instead of being dropped for them."""
    if nbytes <= 8:
        return max(nbytes, 1)
    step = 1 << (nbytes.bit_length() - 4)
    return -(-nbytes // step) * step
