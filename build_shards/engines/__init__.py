"""Who runs a build's blocks: the engine-agnostic unit of work and its engines (local, Ray)."""

from __future__ import annotations

from build_shards.engines.base import BlockTask, Engine, Output, record_bytes, write_block
from build_shards.engines.local import LocalEngine
from build_shards.options import EngineSpec, RayEngine

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


def make_engine(engine: EngineSpec, *, workers: int = 1) -> Engine:
    """The engine ``engine`` names: ``"local"``, ``"ray"`` or a :class:`RayEngine` (see
    :data:`ENGINES`); ValueError for another name or for options the engine does not take.
    Ray is imported only once a Ray build runs."""
    if engine == "local":
        return LocalEngine(workers)
    if engine == "ray" or isinstance(engine, RayEngine):
        if workers != 1:
            raise ValueError(
                "workers is an option of the local engine; engine='ray' runs one task per block "
                "on the cluster's CPUs"
            )
        from build_shards.engines.ray_engine import RayClusterEngine

        address = engine.address if isinstance(engine, RayEngine) else None
        return RayClusterEngine(address)
    raise ValueError(
        f"engine must be one of {', '.join(map(repr, ENGINES))} or a RayEngine, got {engine!r}"
    )
