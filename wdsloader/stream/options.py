"""The option objects of :func:`~wdsloader.create_loader`, one per concern: how the epoch is
planned (:class:`PlanOptions`), which data-parallel rank reads (:class:`Topology`), how the
workers run (:class:`WorkerOptions`), what is decoded and collated
(:class:`DecodeOptions`) and what a failing sample does (:class:`ErrorPolicy`). Reads are
:class:`~wdsloader.io.ReadOptions`; a mix of datasets is :class:`~wdsloader.mix.Mix`.

Each is frozen and checks itself when made: a value out of range, or a combination that cannot
be meant, is a ValueError naming the fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wdsloader.decode.registry import check_images, check_raw_bytes
from wdsloader.stream.dataset_config import ON_ERROR

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum

__all__ = ["DecodeOptions", "ErrorPolicy", "PlanOptions", "Topology", "WorkerOptions"]

WORKER_MODES = ("process", "thread")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOptions:
    """How an epoch is planned. ``span``: samples read together from one shard (one range read);
    ``shuffle_window``: samples a worker shuffles among (and holds in memory). None derives each
    from the split's average sample size (about 256 KiB of data per span, 8 MiB when read
    remotely without a cache; 64 MiB per window)."""

    span: int | None = None
    shuffle_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("span", "shuffle_window"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"PlanOptions.{name} must be an integer >= 1, got {value!r}")


_MESH_CONTRADICTS = (
    "device_mesh gives the data-parallel rank and size; distributed=True, rank and "
    "world_size would contradict it (give one of them)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Which data-parallel rank this loader reads for, out of how many.

    ``rank``/``world_size``: the data-parallel rank and size (give both or neither); every rank of
    a model-parallel (tensor, pipeline, sequence) group passes the same ``rank`` and gets the
    same batches. ``device_mesh`` (a torch ``DeviceMesh``) gives them instead, as the local rank
    and size of its dimension ``dp_dim`` (default ``"dp"``). With none of them,
    ``create_loader(distributed=True)`` takes the global rank and world size from
    ``torch.distributed`` (plain data parallelism), and ``distributed=False`` reads as rank 0 of 1.
    """

    rank: int | None = None
    world_size: int | None = None
    device_mesh: Any = None
    dp_dim: str | None = None

    def __post_init__(self) -> None:
        rank, world = self.rank, self.world_size
        if self.device_mesh is not None and (rank is not None or world is not None):
            raise ValueError(_MESH_CONTRADICTS)
        if self.dp_dim is not None and self.device_mesh is None:
            raise ValueError(
                f"dp_dim={self.dp_dim!r} would be unused: it names a dimension of device_mesh"
            )
        if (rank is None) != (world is None):
            raise ValueError("give both rank and world_size, or neither")
        if world is not None and (not _is_int(world) or world < 1):
            raise ValueError(f"world_size must be an integer >= 1, got {world!r}")
        if rank is not None and (not _is_int(rank) or not 0 <= rank < world):  # type: ignore[operator]
            raise ValueError(f"rank must be an integer in [0, world_size={world}), got {rank!r}")

    def resolve(self, distributed: bool = False) -> tuple[int, int]:
        """``(rank, world_size)``: from the device mesh, given, from ``torch.distributed``
        (``distributed=True``; a ValueError with an explicit rank, world size or mesh) or
        ``(0, 1)``."""
        mesh = self.device_mesh
        if mesh is not None:
            if distributed:
                raise ValueError(_MESH_CONTRADICTS)
            dim = "dp" if self.dp_dim is None else self.dp_dim
            names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
            if dim not in names:
                raise ValueError(
                    f"dp_dim={dim!r} is not a dimension of device_mesh (its dimensions: {names})"
                )
            return int(mesh.get_local_rank(dim)), int(mesh.size(names.index(dim)))
        if not distributed:
            return (self.rank or 0), (self.world_size or 1)
        if self.rank is not None:
            raise ValueError(
                f"rank={self.rank} / world_size={self.world_size} would be unused: "
                f"distributed=True takes them from torch.distributed"
            )
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed=True needs an initialised torch.distributed process group "
                "(call torch.distributed.init_process_group first, e.g. under torchrun)"
            )
        return dist.get_rank(), dist.get_world_size()


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How the ``num_workers`` workers run (all options need ``num_workers > 0``).

    ``mode``: ``"process"`` (default) runs each worker in a torch DataLoader worker process;
    ``"thread"`` runs the same per-worker plans on threads of this process: the same batches
    in the same order (workers take turns, as torch's do), the same resume, ``__index__``,
    ``loader.stats``/``metrics()`` and ``batch_indices``; nothing is pickled (a lambda is a
    fine ``collate_fn``), no worker starts a process, and the workers share this process's
    memory. At ``num_workers=2`` on the bench workloads threads started 2-2.7x sooner, held
    about 40% less RSS of the process tree and made 1.1-2.2x the samples per CPU second
    (samples/s 0.74x for JPEG to 1.8x for the embedding sample); but work that holds the GIL
    (per-sample JSON or label parsing, a Python ``collate_fn``) runs on one core at a time,
    so with many workers and such samples processes scale further (JPEG decoding, reads and
    array copies release it): docs/loading.md has the numbers and when to choose which. An error in a worker thread is raised in the loop as with processes
    (``Caught <type> in DataLoader worker thread <n>`` and the original traceback, the
    original exception as its ``__cause__``); ``worker_init_fn`` is not called (threads share
    the process's random generators); the collate function and decoders are called from
    several threads at once.

    ``persistent_workers`` keeps worker processes between epochs (threads keep their readers
    and buffers between epochs anyway); ``prefetch_factor`` (default 2) batches each keeps
    ready; ``multiprocessing_context`` (``"fork"``, ``"spawn"``, ``"forkserver"`` or a
    context) picks how processes start: under spawn/forkserver a collator, decoder or schedule
    that cannot be pickled (a lambda, a closure) is a ValueError when the loader is made,
    naming it.
    """

    persistent_workers: bool = False
    prefetch_factor: int | None = None
    multiprocessing_context: Any = None
    mode: str = "process"

    def __post_init__(self) -> None:
        factor = self.prefetch_factor
        if factor is not None and (not _is_int(factor) or factor < 1):
            raise ValueError(f"prefetch_factor must be an integer >= 1, got {factor!r}")
        if self.mode not in WORKER_MODES:
            raise ValueError(f"WorkerOptions.mode must be one of {WORKER_MODES}, got {self.mode!r}")
        if self.mode == "thread" and self.multiprocessing_context is not None:
            raise ValueError(
                f"multiprocessing_context={self.multiprocessing_context!r} would be unused: "
                "mode='thread' starts no process"
            )

    def check(self, num_workers: int) -> None:
        """ValueError when an option is set that needs workers and ``num_workers`` is 0."""
        if num_workers > 0:
            return
        if self.persistent_workers or self.prefetch_factor is not None:
            raise ValueError("persistent_workers and prefetch_factor need num_workers > 0")
        if self.mode == "thread":
            raise ValueError(
                "mode='thread' needs num_workers > 0 (with num_workers=0 batches are made in "
                "the main process)"
            )
        if self.multiprocessing_context is not None:
            raise ValueError(
                f"multiprocessing_context={self.multiprocessing_context!r} needs num_workers > 0 "
                f"(with num_workers=0 batches are made in the main process)"
            )

    def loader_kwargs(self, num_workers: int, pin_memory: bool) -> dict[str, Any]:
        """The keyword arguments of torch's DataLoader for ``num_workers`` workers
        (``pin_memory`` only with CUDA); see :meth:`check`."""
        import torch

        self.check(num_workers)
        kwargs: dict[str, Any] = {
            "num_workers": num_workers,
            "pin_memory": bool(pin_memory and torch.cuda.is_available()),
        }
        if num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            kwargs["prefetch_factor"] = self.prefetch_factor or 2
            kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeOptions:
    """What each batch holds.

    ``fields`` limits decoding to those stored fields (a sequence of names; None: all).
    ``curriculum`` (a :class:`~wdsloader.curriculum.Curriculum` or its dict) replaces the stored
    variant fields by one output field drawn per sample and epoch; None uses the manifest's
    default (left out when ``fields`` omits its output), False none. ``collate_options`` make
    the registered collator named by ``create_loader(collate_fn=)`` (e.g.
    ``{"tokenizer": tok}`` for ``"text"``). ``gather=False`` turns off the whole-batch read of
    fixed-size fields (every sample is then parsed on its own). ``allow_pickle`` lets pickled
    fields decode (never by default: unpickling runs code). ``raw_bytes`` is what a raw-bytes
    field (``.bin`` and other encodings without a decoder) holds when the schema declares no
    ``dtype``: ``"uint8"`` (default) as if declared ``uint8`` (one ``uint8[B, n]`` tensor when
    the batch's members share one length, else a list of uint8 views into one buffer of the
    batch), ``"bytes"`` a list of ``bytes``. ``images="encoded"`` leaves image members (JPEG,
    PNG, ...) undecoded: each batch holds a field's encoded files as 1-D uint8 tensors, for
    :class:`~wdsloader.stream.DevicePrefetcher` to decode on the GPU (``images=[field]``:
    nvJPEG on CUDA); the default ``"decoded"`` gives ``uint8`` HWC arrays decoded on the CPU.
    """

    fields: Sequence[str] | None = None
    curriculum: Curriculum | Mapping[str, Any] | bool | None = None
    collate_options: Mapping[str, Any] | None = None
    gather: bool = True
    allow_pickle: bool = False
    raw_bytes: str = "uint8"
    images: str = "decoded"

    def __post_init__(self) -> None:
        check_raw_bytes(self.raw_bytes)
        check_images(self.images)
        if isinstance(self.fields, str):
            raise TypeError(
                f"fields must be a sequence of field names, not the string {self.fields!r}"
            )
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorPolicy:
    """What a sample that fails to read or decode does.

    ``on_error="raise"`` (default) raises; ``"skip"`` skips it (logged, counted in
    ``loader.stats``): a batch yields the samples that decoded, and a batch whose every sample
    failed yields instead the samples of the worker's next batch that has any, so every rank
    still yields ``len(loader)`` batches and resume stays exact. More than ``max_skipped``
    skipped samples in one pass of a rank (None: no limit; needs ``"skip"``) raise
    :class:`~wdsloader.errors.SkipLimitError`. ``check_shards`` checks when the loader is made
    that every shard of the split exists with its recorded size.
    """

    on_error: str = "raise"
    max_skipped: int | None = None
    check_shards: bool = True

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        skipped = self.max_skipped
        if skipped is not None and (not _is_int(skipped) or skipped < 0):
            raise ValueError(f"max_skipped must be None or >= 0, got {skipped!r}")
        if skipped is not None and self.on_error == "raise":
            raise ValueError(f"max_skipped={skipped!r} needs on_error='skip' (nothing is skipped)")
