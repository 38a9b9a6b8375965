"""Writers and readers of every system under test, with the same work for each.

Readers return a DataLoader-like iterable of batches; a batch is a dict with one stacked
``torch.Tensor`` per fixed-size field (batch size 256) and ``"meta"``: the list of decoded JSON
objects. Every reader decodes every field (numpy from the system's own format), stacks the
arrays into tensors and ``json.loads`` each sample's JSON once, and reads one shuffled epoch
with the system's own shuffle, configured as its documentation recommends for training.

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
from collections.abc import Callable, Iterable
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
    "raw_cat": "raw: read files, 8 MiB chunks",
    "raw_tarfile": "raw: tarfile loop over members",
}
# where each reader's data comes from (a folder per workload)
READ_FORMAT = {
    "ours": "ours",
    "webdataset": "webdataset",
    "hf": "webdataset",
    "mosaic": "mosaic",
    "litdata": "litdata",
    "litdata_bd0": "litdata",
    "raw_cat": "ours",
    "raw_tarfile": "ours",
}
WRITERS = ("ours", "webdataset", "mosaic", "litdata")
# read with num_workers > 0 too (HF streaming at ~1,000 samples/s is left at 0 to save time)
MULTI_WORKER = ("ours", "webdataset", "mosaic", "litdata", "litdata_bd0")


# ------------------------------------------------------------------------------------------------
# helpers shared by readers
# ------------------------------------------------------------------------------------------------


def _stack(workload: str, samples: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for f in WORKLOADS[workload].fields:
        values = [np.asarray(s[f.name + suffix], dtype=f.dtype) for s in samples]
        out[f.name] = torch.from_numpy(np.stack(values))
    return out


def collate_text_meta(workload: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the arrays; ``meta`` arrives as JSON text and is parsed here (once per sample)."""
    out = _stack(workload, samples)
    out["meta"] = [json.loads(s["meta"]) for s in samples]
    return out


def collate_decoded_meta(
    workload: str, samples: list[dict[str, Any]], suffix: str = "", meta: str = "meta"
) -> dict[str, Any]:
    """Stack the arrays; ``meta`` was already parsed by the system's own JSON decoder."""
    out = _stack(workload, samples, suffix)
    out["meta"] = [s[meta] for s in samples]
    return out


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
    from build_shards import build_shards

    per_sample = WORKLOADS[workload].field_bytes + 1024
    count = max(1, shard_bytes // per_sample)
    build_shards(
        GeneratedTorchDataset(workload, n),
        out,
        shard_max_count=count,
        shard_max_bytes=shard_bytes,
        block_size=count,  # one shard per block: blocks are what workers share out
        workers=workers,
    )


def write_webdataset(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(
        os.path.join(out, "shard-%06d.tar"), maxcount=10**9, maxsize=shard_bytes, verbose=0
    ) as sink:
        for i in range(n):
            arrays = workloads.arrays(workload, i)
            sample = {"__key__": workloads.key(i), "meta.json": workloads.meta(workload, i)}
            sample.update({f"{name}.npy": a for name, a in arrays.items()})
            sink.write(sample)


def write_mosaic(workload: str, n: int, out: str, workers: int, shard_bytes: int) -> None:
    streaming = import_mosaic()
    columns = {
        f.name: f"ndarray:{f.dtype}:{','.join(map(str, f.shape))}"
        for f in WORKLOADS[workload].fields
    }
    columns["meta"] = "json"
    with streaming.MDSWriter(out=out, columns=columns, size_limit=shard_bytes) as sink:
        for i in range(n):
            sink.write({**workloads.arrays(workload, i), "meta": workloads.meta(workload, i)})


def litdata_item(workload: str, i: int) -> dict[str, Any]:
    """One LitData item: the arrays and the JSON text (module level: optimize pickles it)."""
    return {**workloads.arrays(workload, i), "meta": workloads.meta_json(workload, i)}


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
}


# ------------------------------------------------------------------------------------------------
# readers: read(workload, path, workers, storage_options) -> iterable of batches
# ------------------------------------------------------------------------------------------------


def read_ours(
    workload: str, path: str, workers: int, storage_options: dict[str, Any] | None = None
) -> Iterable[Any]:
    from wdsloader import create_loader

    return create_loader(
        path,
        "train",
        batch_size=BATCH,
        num_workers=workers,
        seed=0,
        storage_options=storage_options,
    )


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
        .decode()
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
    "webdataset": lambda: importlib.import_module("webdataset"),
    "mosaic": import_mosaic,
    "litdata": lambda: importlib.import_module("litdata"),
    "litdata_bd0": lambda: importlib.import_module("litdata"),
    "hf": lambda: importlib.import_module("datasets"),
}


# ------------------------------------------------------------------------------------------------
# raw limits: iterate "chunks" whose sizes are counted; no decoding
# ------------------------------------------------------------------------------------------------

CHUNK = 8 * 2**20


def raw_cat(path: str) -> Iterable[int]:
    """Every shard file's bytes, read into one 8 MiB buffer; yields the bytes of each read."""
    buf = bytearray(CHUNK)
    for name in tar_files(path):
        with open(name, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf)
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


RAW: dict[str, Callable[[str], Iterable[int]]] = {"raw_cat": raw_cat, "raw_tarfile": raw_tarfile}
