"""Writers and readers of every system under test, with the same work for each.

Readers return a DataLoader-like iterable of batches. Every system ends with the same batch
(batch size 256): one stacked ``torch.Tensor`` per payload field (``npy`` arrays as stored,
``bin`` blobs as ``uint8[n, nbytes]``, JPEGs decoded to ``uint8[n, H, W, 3]``), ``"label"`` as
an ``int64[n]`` tensor and ``"meta"`` as the list of decoded JSON objects (those the workload
has). Each system decodes with its own decoders where it has them and the bench's collate does
the rest (:func:`finish` for ours: whatever our loader did not already make a tensor); every
reader reads one shuffled epoch with the system's own shuffle, configured as its documentation
recommends for training.

Peers are imported inside the functions, so a missing peer only fails its own measurements.
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from bench import workloads
from bench.workloads import WORKLOADS

BATCH = 256
SHARD_BYTES = 64 * 2**20  # shard / chunk size for every writer (--quick: 4 MiB)
WDS_SHARD_SHUFFLE = 100  # webdataset's own default for shardshuffle=True
WDS_BUFFER = 5000  # sample shuffle buffer for webdataset
HF_BUFFER = 1000  # datasets' default IterableDataset.shuffle buffer

# system -> (importable module, pip distribution)
PEERS = {
    "webdataset": ("webdataset", "webdataset"),
    "mosaic": ("streaming", "mosaicml-streaming"),
    "litdata": ("litdata", "litdata"),
    "litdata_bd0": ("litdata", "litdata"),
    "hf": ("datasets", "datasets"),
}
TITLES = {
    "ours": "wdsloader",
    "webdataset": "webdataset",
    "mosaic": "MosaicML Streaming",
    "litdata": "LitData",
    "litdata_bd0": "LitData (batch_decode=0)",
    "hf": "HF datasets (webdataset, streaming)",
    "ours_adopted": "wdsloader on adopted webdataset shards",
    "raw_read": "raw limit: readinto loop, 1 MiB buffer",
    "raw_batches": "raw: readinto a fresh batch-sized buffer",
    "raw_tarfile": "raw: tarfile loop over members",
}
# where each reader's data comes from (a folder per workload)
READ_FORMAT = {
    "ours": "ours",
    "ours_adopted": "adopted",
    "webdataset": "webdataset",
    "hf": "webdataset",
    "mosaic": "mosaic",
    "litdata": "litdata",
    "litdata_bd0": "litdata",
    "raw_read": "ours",
    "raw_batches": "ours",
    "raw_tarfile": "ours",
}
WRITERS = ("ours", "webdataset", "mosaic", "litdata")
# systems that read only some workloads (the others are left out of their tables)
ONLY_WORKLOADS = {"ours_adopted": ("embed",), "hf": ("embed",)}
# read with num_workers > 0 too (HF streaming at ~1,000 samples/s is left at 0 to save time)
MULTI_WORKER = ("ours", "webdataset", "mosaic", "litdata", "litdata_bd0")


# ------------------------------------------------------------------------------------------------
# helpers shared by readers
# ------------------------------------------------------------------------------------------------


def _value(field: workloads.Field, value: Any) -> np.ndarray:
    """One sample's payload value as the numpy array the batch stacks."""
    if isinstance(value, np.ndarray):
        return value
    if field.kind == "jpg" and isinstance(value, (bytes, bytearray, memoryview)):
        return decode_jpeg(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(value, dtype=np.uint8)
    return np.asarray(value, dtype=field.dtype)


def decode_jpeg(data: Any) -> np.ndarray:
    """A JPEG as ``uint8[H, W, 3]`` through Pillow (the decode every system does)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as img:
        return np.asarray(img.convert("RGB"))


def _stack(workload: str, samples: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    import torch

    wl = WORKLOADS[workload]
    out: dict[str, Any] = {}
    for f in wl.fields:
        ext = f".{f.kind}" if suffix else ""
        values = [_value(f, s[f.name + ext]) for s in samples]
        out[f.name] = torch.from_numpy(np.stack(values))
    if wl.label:
        name = "label.cls" if suffix else "label"
        out["label"] = torch.tensor([int(s[name]) for s in samples], dtype=torch.int64)
    return out


def collate_text_meta(workload: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the payload; ``meta`` arrives as JSON text and is parsed here (once per sample)."""
    out = _stack(workload, samples)
    if WORKLOADS[workload].meta:
        out["meta"] = [json.loads(s["meta"]) for s in samples]
    return out


def collate_decoded_meta(
    workload: str, samples: list[dict[str, Any]], suffix: str = "", meta: str = "meta"
) -> dict[str, Any]:
    """Stack the payload; ``meta`` was already parsed by the system's own JSON decoder."""
    out = _stack(workload, samples, suffix)
    if WORKLOADS[workload].meta:
        out["meta"] = [s[meta] for s in samples]
    return out


def finish(workload: str, batch: dict[str, Any]) -> dict[str, Any]:
    """Our loader's batch brought to the common structure: each payload field and the label
    as a tensor (a no-op for what the loader already stacked)."""
    import torch

    wl = WORKLOADS[workload]
    for f in wl.fields:
        value = batch[f.name]
        if not isinstance(value, torch.Tensor):
            batch[f.name] = torch.from_numpy(np.stack([_value(f, v) for v in value]))
    if wl.label and not isinstance(batch["label"], torch.Tensor):
        batch["label"] = torch.tensor([int(v) for v in batch["label"]], dtype=torch.int64)
    return batch


class Finished:
    """Iterate ``loader`` and :func:`finish` each batch (picklable, no closure)."""

    def __init__(self, workload: str, loader: Any) -> None:
        self.workload = workload
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield finish(self.workload, batch)


def tar_files(path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(path, "**", "*.tar"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no .tar files under {path}")
    return files


def import_mosaic() -> types.ModuleType:
    """``import streaming``; it imports torchvision at import time (for ``streaming.vision``).

    PyPI's torchvision wheels are built against CUDA torch and fail to import next to the CPU
    build of torch 2.13.0; none of the code measured here uses torchvision, so when the real
    package cannot be imported a stub stands in for the three names ``streaming.vision``
    imports. Reading and writing MDS never touch it.
    """
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure: replace it
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def _unavailable(*_: Any, **__: Any) -> Any:
            raise RuntimeError("torchvision is not importable in this environment")

        def module(name: str, **attrs: Any) -> types.ModuleType:
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            mod.__path__ = []
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
            return mod

        vision_dataset = type("VisionDataset", (), {"__init__": _unavailable})
        tv = module("torchvision")
        tv.datasets = module("torchvision.datasets", VisionDataset=vision_dataset, CIFAR10=None)
        tv.transforms = module("torchvision.transforms")
        tv.transforms.functional = module("torchvision.transforms.functional", to_tensor=None)
    return importlib.import_module("streaming")


# ------------------------------------------------------------------------------------------------
# writers: write(workload, n, out, workers) -> None; ``out`` does not exist yet
# ------------------------------------------------------------------------------------------------


def write_ours(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    from bench.torch_source import GeneratedTorchDataset
    from build_shards import ShardOptions, build_shards

    per_sample = WORKLOADS[workload].field_bytes + 1024
    count = max(1, shard_bytes // per_sample)
    build_shards(
        GeneratedTorchDataset(workload, n),
        out,
        shards=ShardOptions(max_count=count, max_bytes=shard_bytes),
        workers=workers,  # the default block size: the same shards for any worker count
    )


def wds_sample(workload: str, i: int) -> dict[str, Any]:
    """Sample ``i`` as webdataset's ShardWriter takes it (extensions in the names)."""
    wl = WORKLOADS[workload]
    values = workloads.arrays(workload, i)
    sample: dict[str, Any] = {"__key__": workloads.key(i)}
    sample.update({f.member: values[f.name] for f in wl.fields})
    extras = workloads.extras(workload, i)
    if "label" in extras:
        sample["label.cls"] = extras["label"]
    if "meta" in extras:
        sample["meta.json"] = extras["meta"]
    return sample


def write_webdataset(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(
        os.path.join(out, "shard-%06d.tar"), maxcount=10**9, maxsize=shard_bytes, verbose=0
    ) as sink:
        for i in range(n):
            sink.write(wds_sample(workload, i))


def write_adopted(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    """webdataset's ShardWriter output, then adopted by ``build_shards.adopt`` (idx files and a
    manifest beside the untouched tars); the adoption is part of the time measured."""
    from build_shards.adopt import adopt

    write_webdataset(workload, n, os.path.join(out, "train"), workers, shard_bytes)
    adopt(out)


def write_mosaic(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    streaming = import_mosaic()
    wl = WORKLOADS[workload]
    columns = {
        f.name: f"ndarray:{f.dtype}:{','.join(map(str, f.shape))}" if f.kind == "npy" else "bytes"
        for f in wl.fields
    }
    if wl.label:
        columns["label"] = "int"
    if wl.meta:
        columns["meta"] = "json"
    with streaming.MDSWriter(out=out, columns=columns, size_limit=shard_bytes) as sink:
        for i in range(n):
            sink.write({**workloads.arrays(workload, i), **workloads.extras(workload, i)})


def litdata_item(workload: str, i: int) -> dict[str, Any]:
    """One LitData item: the payload, the label and the JSON text (module level: optimize
    pickles it)."""
    item = {**workloads.arrays(workload, i)}
    extras = workloads.extras(workload, i)
    if "label" in extras:
        item["label"] = extras["label"]
    if "meta" in extras:
        item["meta"] = workloads.meta_json(workload, i)
    return item


def write_litdata(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    import litdata

    litdata.optimize(
        fn=functools.partial(litdata_item, workload),
        inputs=list(range(n)),
        output_dir=out,
        num_workers=workers,
        chunk_bytes=shard_bytes,
        verbose=False,
    )


WRITE: dict[str, Callable[[str, int, str, int, int], None]] = {
    "ours": write_ours,
    "webdataset": write_webdataset,
    "mosaic": write_mosaic,
    "litdata": write_litdata,
    "adopted": write_adopted,
}


# ------------------------------------------------------------------------------------------------
# readers: read(workload, path, workers, storage_options) -> iterable of batches
# ------------------------------------------------------------------------------------------------


def read_ours(
    workload: str, path: str, workers: int, storage_options: dict[str, Any] | None = None
) -> Iterable[Any]:
    from wdsloader import create_loader

    loader = create_loader(
        path,
        "train",
        batch_size=BATCH,
        num_workers=workers,
        seed=0,
        storage_options=storage_options,
    )
    return Finished(workload, loader)


def read_webdataset(workload: str, path: str, workers: int, storage_options: Any = None) -> Any:
    import webdataset as wds

    ds = (
        wds.WebDataset(
            tar_files(path),
            shardshuffle=WDS_SHARD_SHUFFLE,
            seed=0,
            workersplitter=wds.split_by_worker,
        )
        .shuffle(WDS_BUFFER)
        .decode(*(["rgb8"] if any(f.kind == "jpg" for f in WORKLOADS[workload].fields) else []))
        .batched(
            BATCH,
            collation_fn=functools.partial(
                collate_decoded_meta, workload, suffix=".npy", meta="meta.json"
            ),
            partial=True,
        )
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


def read_mosaic(workload: str, path: str, workers: int, storage_options: Any = None) -> Any:
    from torch.utils.data import DataLoader

    streaming = import_mosaic()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(local=path, shuffle=True, shuffle_seed=0, batch_size=BATCH)
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(collate_decoded_meta, workload),
    )


def read_litdata(
    workload: str, path: str, workers: int, storage_options: Any = None, **options: Any
) -> Any:
    import litdata

    ds = litdata.StreamingDataset(path, shuffle=True, seed=0, **options)
    return litdata.StreamingDataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(collate_text_meta, workload),
    )


def read_hf(workload: str, path: str, workers: int, storage_options: Any = None) -> Any:
    import datasets
    from torch.utils.data import DataLoader

    datasets.disable_progress_bars()
    ds = datasets.load_dataset(
        "webdataset", data_files={"train": tar_files(path)}, split="train", streaming=True
    )
    # no with_format: its "numpy" format gives object arrays for 1-D fields and "torch" is
    # several times slower; the default (python lists, made arrays in the collate) is fastest
    ds = ds.shuffle(seed=0, buffer_size=HF_BUFFER)
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(
            collate_decoded_meta, workload, suffix=".npy", meta="meta.json"
        ),
    )


READ: dict[str, Callable[..., Any]] = {
    "ours": read_ours,
    "ours_adopted": read_ours,
    "webdataset": read_webdataset,
    "mosaic": read_mosaic,
    "litdata": read_litdata,
    # LitData's default batch_decode="auto" decodes (copies) a window of items around each one
    # it serves when shuffling: 10x slower on 160 KiB blobs; batch_decode=0 decodes one item
    "litdata_bd0": functools.partial(read_litdata, batch_decode=0),
    "hf": read_hf,
}
IMPORTS: dict[str, Callable[[], Any]] = {
    "ours": lambda: importlib.import_module("wdsloader.stream"),
    "ours_adopted": lambda: importlib.import_module("wdsloader.stream"),
    "adopted": lambda: importlib.import_module("webdataset"),
    "webdataset": lambda: importlib.import_module("webdataset"),
    "mosaic": import_mosaic,
    "litdata": lambda: importlib.import_module("litdata"),
    "litdata_bd0": lambda: importlib.import_module("litdata"),
    "hf": lambda: importlib.import_module("datasets"),
}


# ------------------------------------------------------------------------------------------------
# raw limits: iterate "chunks" whose sizes are counted; no decoding. The runner reads the files
# once untimed in the same process first (a warm page cache, exactly like the reads they bound).
# ------------------------------------------------------------------------------------------------

CHUNK = 2**20  # fits the L2 cache: the copy out of the page cache is all that is timed


def raw_read(path: str, chunk: int = CHUNK) -> Iterable[int]:
    """Every shard file's bytes, read into one reused ``chunk``-byte buffer (``readinto``);
    yields the bytes of each read."""
    buf = bytearray(chunk)
    for name in tar_files(path):
        with open(name, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                yield got


def raw_batches(path: str, chunk: int) -> Iterable[int]:
    """The same bytes read into a fresh ``chunk``-byte numpy buffer at a time (the runner
    passes the bytes of one batch of samples), as a loader that hands out each batch in memory
    of its own must: the copy's destination is new memory, not a cached buffer."""
    for name in tar_files(path):
        with open(name, "rb", buffering=0) as f:
            while True:
                got = f.readinto(memoryview(np.empty(chunk, dtype=np.uint8)))
                if not got:
                    break
                yield got


def raw_tarfile(path: str) -> Iterable[int]:
    """A bare loop over the members of every shard (``tarfile`` stream mode), reading each."""
    import tarfile

    for name in tar_files(path):
        with tarfile.open(name, mode="r|") as tf:
            for member in tf:
                if member.isfile():
                    f = tf.extractfile(member)
                    assert f is not None
                    yield len(f.read())


RAW: dict[str, Callable[..., Iterable[int]]] = {
    "raw_read": raw_read,
    "raw_batches": raw_batches,
    "raw_tarfile": raw_tarfile,
}
