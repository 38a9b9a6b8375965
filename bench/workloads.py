"""The benchmark workloads: deterministic synthetic samples, the same for every writer.

A workload's sample holds its fields (numpy arrays stored as ``.npy``, fixed-length byte blobs
stored as ``.bin``, or JPEG images stored as ``.jpg``), optionally ``label`` (an int class label,
stored the WebDataset way as ``.cls``) and ``meta`` (a small JSON object). Readers recover the
stream order from ``meta["i"]`` (after the JSON decode every reader does); a workload without
JSON (``embed_arrays``) carries the position in element 0 of its first array instead. Arrays
are cut from a pool generated once per process from a fixed numpy seed, JPEGs are a small pool
of encoded images, so generating a sample costs next to nothing and every writer sees
byte-identical data.
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
    """A payload field; ``kind`` is how it is stored: ``npy`` (an array), ``bin`` (raw bytes of
    a constant length, read back as a uint8 vector) or ``jpg`` (a JPEG decoded to uint8 HWC)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str = "npy"

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded value (for ``jpg``: of the decoded pixels)."""
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    @property
    def member(self) -> str:
        """The sample-dict name with its extension (``blob.bin``), as every writer stores it."""
        return f"{self.name}.{self.kind}"


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    title: str
    fields: tuple[Field, ...]
    full_n: int
    quick_n: int
    label: bool = True  # an int class label, ``label.cls``
    labels: str = "hashed"  # which: see :func:`label`
    meta: bool = True  # a JSON object, ``meta.json``

    def n(self, quick: bool) -> int:
        return self.quick_n if quick else self.full_n

    @property
    def field_bytes(self) -> int:
        """Stored bytes of the payload fields of one sample (a JPEG: its mean encoded size)."""
        return sum(_jpeg_mean_bytes(f) if f.kind == "jpg" else f.nbytes for f in self.fields)

    def extra_bytes(self, i: int) -> int:
        """Stored bytes of sample ``i``'s label and JSON text."""
        size = len(str(label(i, self.labels))) if self.label else 0
        return size + (len(meta_json(self.name, i)) if self.meta else 0)

    def bytes_per_sample(self, n: int) -> int:
        """Payload bytes of a typical sample of ``n`` (the label and JSON of the middle one)."""
        return self.field_bytes + self.extra_bytes(n // 2)

    def payload_bytes(self, n: int) -> int:
        """Bytes of the samples' stored values (arrays, blobs, JPEGs, label and JSON text),
        no container overhead."""
        return n * self.field_bytes + sum(self.extra_bytes(i) for i in range(n))

    def order(self, batch: Any) -> list[int]:
        """The source positions of a batch's samples (from its JSON, or element 0 of its
        first array)."""
        if self.meta:
            return [int(m["i"]) for m in batch["meta"]]
        first = batch[self.fields[0].name]
        return [int(v) for v in first.reshape(len(first), -1)[:, 0].tolist()]


_EMBED = (
    Field("question_emb", "float32", (384,)),
    Field("steering", "float32", (384,)),
    Field("negatives", "float32", (4, 384)),
)
JPEG_POOL = 16  # distinct images; sample i shows image i % JPEG_POOL
JPEG_QUALITY = 90

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="embed",
            title="realistic embedding samples (question_emb f32[384], steering f32[384], "
            "negatives f32[4,384], int label .cls, JSON; ~9.4 KB)",
            fields=_EMBED,
            full_n=102_400,
            quick_n=10_240,
        ),
        Workload(
            name="embed_running",
            title="the realistic sample with running-index labels (.cls of 1-6 digits)",
            fields=_EMBED,
            full_n=102_400,
            quick_n=10_240,
            labels="running",
        ),
        Workload(
            name="embed_few",
            title="the realistic sample with 10-class labels (.cls of one digit)",
            fields=_EMBED,
            full_n=102_400,
            quick_n=10_240,
            labels="few",
        ),
        Workload(
            name="embed_arrays",
            title="embedding arrays only (the same three arrays, no label, no JSON; ~9.2 KB)",
            fields=_EMBED,
            full_n=102_400,
            quick_n=10_240,
            label=False,
            meta=False,
        ),
        Workload(
            name="blobs",
            title="large blobs (blob: 160 KiB of bytes as .bin, int label .cls, JSON)",
            fields=(Field("blob", "uint8", (160 * 1024,), kind="bin"),),
            full_n=6_144,
            quick_n=1_024,
        ),
        Workload(
            name="jpeg",
            title="JPEG images (256x256 RGB, decoded to uint8 HWC; int label .cls, JSON)",
            fields=(Field("image", "uint8", (256, 256, 3), kind="jpg"),),
            full_n=4_096,
            quick_n=768,
        ),
        Workload(
            name="tokens",
            title="tokenized text (tokens i32[512], int label .cls, JSON; ~2.2 KB)",
            fields=(Field("tokens", "int32", (512,)),),
            full_n=40_960,
            quick_n=2_560,
        ),
    )
}

# The memory check reads the embedding workload at N and 10 N; the build check writes this many.
MEMORY_SMALL_FRACTION = 10
BUILD_N = {"embed": {"full": 20_480, "quick": 4_096}, "blobs": {"full": 2_048, "quick": 512}}


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


@cache
def _jpegs(height: int, width: int) -> tuple[bytes, ...]:
    """``JPEG_POOL`` photo-like JPEGs (smooth gradients, shapes and a little noise)."""
    import io

    from PIL import Image

    rng = np.random.default_rng([SEED, height, width])
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for k in range(JPEG_POOL):
        a, b, c = rng.uniform(0.01, 0.08, 3)
        img = np.stack(
            [
                127 + 100 * np.sin(a * xx + k),
                127 + 100 * np.cos(b * yy - k),
                127 + 100 * np.sin(c * (xx + yy)),
            ],
            axis=-1,
        )
        img += rng.normal(0, 12, img.shape)
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(20, 90)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.integers(0, 255, 3)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            buf, format="JPEG", quality=JPEG_QUALITY
        )
        out.append(buf.getvalue())
    return tuple(out)


def _jpeg_mean_bytes(f: Field) -> int:
    pool = _jpegs(*f.shape[:2])
    return sum(map(len, pool)) // len(pool)


def label(i: int, kind: str = "hashed") -> int:
    """Sample ``i``'s class label: ``hashed`` one of 1,000 (1-3 digits in every shard),
    ``running`` the sample's index (a width that changes once per power of ten: shards whose
    labels have one width and shards whose labels do not, as a user's running ids give), ``few``
    one of 10 (one digit)."""
    if kind == "running":
        return i
    if kind == "few":
        return i % 10
    return (i * 7919) % 1000


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


def arrays(workload: str, i: int) -> dict[str, Any]:
    """The payload fields of sample ``i`` of ``workload`` (deterministic), by field name:
    numpy arrays for ``npy``, ``bytes`` for ``bin`` and ``jpg``."""
    wl = WORKLOADS[workload]
    out: dict[str, Any] = {}
    for f in wl.fields:
        if f.kind == "jpg":
            out[f.name] = _jpegs(*f.shape[:2])[i % JPEG_POOL]
            continue
        pool = _pool(workload, f.name)
        if f.dtype == "uint8":
            start = (i * 4093) % (len(pool) - f.nbytes)
            value = pool[start : start + f.nbytes].reshape(f.shape)
            out[f.name] = value.tobytes() if f.kind == "bin" else value
        elif len(f.shape) == 1:
            out[f.name] = pool[(i * 31 + len(f.name)) % POOL_ROWS]
        else:
            rows = [(i * 13 + k * 101 + 5) % POOL_ROWS for k in range(f.shape[0])]
            out[f.name] = pool[rows]
    if not wl.meta:  # the position travels in element 0 of the first array
        first = wl.fields[0].name
        out[first] = out[first].copy()
        out[first].reshape(-1)[0] = i
    return out


def extras(workload: str, i: int) -> dict[str, Any]:
    """Sample ``i``'s label and JSON object (those the workload has), by field name."""
    wl = WORKLOADS[workload]
    out: dict[str, Any] = {}
    if wl.label:
        out["label"] = label(i, wl.labels)
    if wl.meta:
        out["meta"] = meta(workload, i)
    return out


def key(i: int) -> str:
    return f"{i:08d}"


def sample(workload: str, i: int) -> dict[str, Any]:
    """Sample ``i`` as our builder's source gives it: ``__key__``, the payload under its
    member name (``question_emb``, ``blob.bin``, ``image.jpg``), ``label`` and ``meta``."""
    wl = WORKLOADS[workload]
    values = arrays(workload, i)
    out: dict[str, Any] = {"__key__": key(i)}
    for f in wl.fields:
        out[f.name if f.kind == "npy" else f.member] = values[f.name]
    out.update(extras(workload, i))
    return out


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
