"""The benchmark workloads: deterministic synthetic samples, the same for every writer.

Every sample has fixed-size numpy fields (the workload's payload) and ``meta``, a small JSON
object whose ``"i"`` is the sample's position in the source: readers recover the stream order
from it after ``json.loads`` (part of the work every reader does). Arrays are cut from a pool
generated once per process from a fixed numpy seed, so generating a sample costs next to nothing
and every writer sees byte-identical data.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import numpy as np

SEED = 20261122
POOL_ROWS = 4099  # prime: consecutive samples do not repeat rows in a short cycle


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    title: str
    fields: tuple[Field, ...]
    full_n: int
    quick_n: int

    def n(self, quick: bool) -> int:
        return self.quick_n if quick else self.full_n

    @property
    def field_bytes(self) -> int:
        return sum(f.nbytes for f in self.fields)

    def bytes_per_sample(self, n: int) -> int:
        """Payload bytes of a typical sample of ``n`` (the JSON of the middle one)."""
        return self.field_bytes + len(meta_json(self.name, n // 2))

    def payload_bytes(self, n: int) -> int:
        """Bytes of the samples' values (arrays + JSON text), no container overhead."""
        return n * self.field_bytes + sum(len(meta_json(self.name, i)) for i in range(n))


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="embed",
            title="embedding samples (question_emb f32[384], steering f32[384], "
            "negatives f32[4,384], JSON; ~9.4 KB)",
            fields=(
                Field("question_emb", "float32", (384,)),
                Field("steering", "float32", (384,)),
                Field("negatives", "float32", (4, 384)),
            ),
            full_n=102_400,
            quick_n=2_560,
        ),
        Workload(
            name="tokens",
            title="tokenized text (tokens i32[512], JSON; ~2.2 KB)",
            fields=(Field("tokens", "int32", (512,)),),
            full_n=40_960,
            quick_n=2_560,
        ),
        Workload(
            name="blobs",
            title="large blobs (blob u8[163840], JSON; 160 KiB)",
            fields=(Field("blob", "uint8", (160 * 1024,)),),
            full_n=6_144,
            quick_n=256,
        ),
    )
}

# The memory check reads the embedding workload at N and 10 N; the build check writes this many.
MEMORY_SMALL_FRACTION = 10
BUILD_N = {"full": 20_480, "quick": 1_024}


@cache
def _pool(workload: str, field: str) -> np.ndarray:
    wl = WORKLOADS[workload]
    spec = next(f for f in wl.fields if f.name == field)
    rng = np.random.default_rng([SEED, sum(map(ord, workload)), sum(map(ord, field))])
    if spec.dtype == "uint8":
        # one long random byte string; sample i is a window into it
        return np.frombuffer(rng.bytes(4 * spec.nbytes), dtype=np.uint8)
    if spec.dtype.startswith("int"):
        return rng.integers(0, 50_257, size=(POOL_ROWS, spec.shape[-1]), dtype=spec.dtype)
    return rng.standard_normal((POOL_ROWS, spec.shape[-1]), dtype=np.float32).astype(spec.dtype)


def meta(workload: str, i: int) -> dict[str, Any]:
    """The JSON field of sample ``i`` (about 130 bytes)."""
    return {
        "i": i,
        "question_id": f"q{i:08d}",
        "cluster": i % 97,
        "difficulty": round((i % 7) / 7, 3),
        "source": f"synthetic-{workload}",
        "lang": "en",
    }


def meta_json(workload: str, i: int) -> str:
    return json.dumps(meta(workload, i), separators=(",", ":"))


def arrays(workload: str, i: int) -> dict[str, np.ndarray]:
    """The numpy fields of sample ``i`` of ``workload`` (deterministic)."""
    out: dict[str, np.ndarray] = {}
    for f in WORKLOADS[workload].fields:
        pool = _pool(workload, f.name)
        if f.dtype == "uint8":
            start = (i * 4093) % (len(pool) - f.nbytes)
            out[f.name] = pool[start : start + f.nbytes].reshape(f.shape)
        elif len(f.shape) == 1:
            out[f.name] = pool[(i * 31 + len(f.name)) % POOL_ROWS]
        else:
            rows = [(i * 13 + k * 101 + 5) % POOL_ROWS for k in range(f.shape[0])]
            out[f.name] = pool[rows]
    return out


def key(i: int) -> str:
    return f"{i:08d}"


def sample(workload: str, i: int) -> dict[str, Any]:
    """Sample ``i`` as a dict: ``__key__``, the arrays and ``meta`` (a dict)."""
    return {"__key__": key(i), **arrays(workload, i), "meta": meta(workload, i)}


class GeneratedDataset:
    """A map-style dataset of ``n`` samples of ``workload`` (picklable: the pool is rebuilt)."""

    def __init__(self, workload: str, n: int) -> None:
        self.workload = workload
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return sample(self.workload, i)
