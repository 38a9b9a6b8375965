"""What ``create_loader`` settles before planning: the data-parallel rank and world size,
and the store and manifest of a dataset."""

from __future__ import annotations

from typing import Any

from wdsloader.curriculum.curriculum import stored_curriculum
from wdsloader.errors import ManifestError
from wdsloader.format import Manifest
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.io.manifest_io import load_manifest, manifest_where
from wdsloader.io.store import open_store


def rank_and_world(
    distributed: bool,
    rank: int | None,
    world_size: int | None,
    device_mesh: Any = None,
    dp_dim: str | None = None,
) -> tuple[int, int]:
    """The data-parallel rank and size: from ``device_mesh``'s ``dp_dim``, torch.distributed,
    or given; ValueError for a contradictory or unused combination."""
    if device_mesh is not None:
        if distributed or rank is not None or world_size is not None:
            raise ValueError(
                "device_mesh gives the data-parallel rank and size; distributed=True, rank and "
                "world_size would contradict it (give one of them)"
            )
        dim = "dp" if dp_dim is None else dp_dim
        names = tuple(getattr(device_mesh, "mesh_dim_names", None) or ())
        if dim not in names:
            raise ValueError(
                f"dp_dim={dim!r} is not a dimension of device_mesh (its dimensions: {names})"
            )
        return int(device_mesh.get_local_rank(dim)), int(device_mesh.size(names.index(dim)))
    if dp_dim is not None:
        raise ValueError(f"dp_dim={dp_dim!r} would be unused: it names a dimension of device_mesh")
    if distributed:
        import torch.distributed as dist

        if rank is not None or world_size is not None:
            raise ValueError(
                f"rank={rank} / world_size={world_size} would be unused: distributed=True "
                f"takes them from torch.distributed"
            )
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed=True needs an initialised torch.distributed process group "
                "(call torch.distributed.init_process_group first, e.g. under torchrun)"
            )
        return dist.get_rank(), dist.get_world_size()
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    return (rank or 0), (world_size or 1)


def open_dataset(
    root: str, options: ReadOptions, check_shards: bool, split: str
) -> tuple[ShardStore, Manifest]:
    """The store over ``root`` and its manifest (read under the options' timeouts; its default
    curriculum checked)."""
    store = open_store(root, options)
    try:
        storage_options = options.storage_options_for(root)
        manifest = load_manifest(root, storage_options)
        stored_curriculum(manifest.loader_defaults, manifest_where(root, storage_options))
    except ManifestError as exc:  # its message shows the root as given, userinfo included
        raise ManifestError(store.redact(exc)) from None
    shards = manifest.split(split).shards
    if check_shards:
        store.check_shards(shards)
    store.ship_indexes(shards)  # read once, in parallel, not again in each worker
    return store, manifest
