"""Who runs a build's blocks: the engine-agnostic unit of work and its engines (local, Ray)."""

from __future__ import annotations

from build_shards.engines.base import BlockTask, Engine, Output, record_bytes, write_block
from build_shards.engines.local import LocalEngine

ENGINES = ("local", "ray")

__all__ = [
    "ENGINES",
    "BlockTask",
    "Engine",
    "LocalEngine",
    "Output",
    "make_engine",
    "record_bytes",
    "write_block",
]


def make_engine(name: str, *, workers: int = 1, ray_address: str | None = None) -> Engine:
    """The engine called ``name`` (one of :data:`ENGINES`); ValueError for another name or for
    options the engine does not take. Ray is imported only once a Ray build runs."""
    if name == "local":
        if ray_address is not None:
            raise ValueError("ray_address is an option of engine='ray'")
        return LocalEngine(workers)
    if name == "ray":
        if workers != 1:
            raise ValueError(
                "workers is an option of the local engine; engine='ray' runs one task per block "
                "on the cluster's CPUs"
            )
        from build_shards.engines.ray_engine import RayEngine

        return RayEngine(ray_address)
    raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, got {name!r}")
