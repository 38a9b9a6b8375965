"""Every system reading its dataset from the S3 server, configured as its documentation says.

The same batch as the local benchmark (bench/systems.py: batch 256, the same collate), from an
``s3://`` URL: ours ``create_loader("s3://...")`` (with and without ``cache_dir``), LitData
``StreamingDataset("s3://...")``, Mosaic ``remote=``/``local=``, webdataset through fsspec, HF
``load_dataset("webdataset", streaming=True, storage_options=...)``. Each run's local cache is
the empty folder ``$WDS_BENCH_CACHE`` (the runner makes it and removes it afterwards); the
endpoint and credentials come from ``storage_options`` and the ``AWS_*``/``S3_ENDPOINT_URL``
environment the runner sets.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from bench import systems
from bench.systems import BATCH, HF_BUFFER, WDS_BUFFER, WDS_SHARD_SHUFFLE


def cache_dir() -> str:
    path = os.environ.get("WDS_BENCH_CACHE")
    if not path:
        raise RuntimeError("WDS_BENCH_CACHE is not set: the remote runner sets it per run")
    return path


def list_tars(url: str, options: dict[str, Any]) -> list[str]:
    """The ``.tar`` objects under ``url`` (one LIST, before the timed part is over: every
    webdataset user lists or writes out the shard names)."""
    import fsspec

    fs, _, _ = fsspec.get_fs_token_paths(url, storage_options=options)
    names = sorted(p for p in fs.find(url) if p.endswith(".tar"))
    if not names:
        raise FileNotFoundError(f"no .tar objects under {url}")
    return ["s3://" + p for p in names]


def read_ours(workload: str, url: str, workers: int, options: Any = None) -> Any:
    from wdsloader import create_loader

    loader = create_loader(
        url, "train", batch_size=BATCH, num_workers=workers, seed=0, storage_options=options
    )
    return systems.Finished(workload, loader)


def read_ours_obstore(workload: str, url: str, workers: int, options: Any = None) -> Any:
    from wdsloader import ReadOptions, create_loader

    read = ReadOptions(storage_options=options, transport="obstore")
    loader = create_loader(
        url, "train", batch_size=BATCH, num_workers=workers, seed=0, read_options=read
    )
    return systems.Finished(workload, loader)


def read_ours_cache(workload: str, url: str, workers: int, options: Any = None) -> Any:
    from wdsloader import create_loader

    loader = create_loader(
        url,
        "train",
        batch_size=BATCH,
        num_workers=workers,
        seed=0,
        storage_options=options,
        cache_dir=cache_dir(),
    )
    return systems.Finished(workload, loader)


def read_litdata(workload: str, url: str, workers: int, options: Any = None) -> Any:
    import litdata
    from litdata.streaming import downloader

    # LitData fetches chunks with obstore, which refuses http:// endpoints unless told; the
    # loopback server is plain http (a real S3 endpoint is https and needs no such line)
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    client = {
        "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    ds = litdata.StreamingDataset(
        url, cache_dir=cache_dir(), shuffle=True, seed=0, storage_options=client
    )
    return litdata.StreamingDataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(systems.collate_text_meta, workload),
    )


def read_mosaic(workload: str, url: str, workers: int, options: Any = None) -> Any:
    from torch.utils.data import DataLoader

    streaming = systems.import_mosaic()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(
        remote=url, local=cache_dir(), shuffle=True, shuffle_seed=0, batch_size=BATCH
    )
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(systems.collate_decoded_meta, workload),
    )


def _fsspec_open(options: dict[str, Any], url: str, mode: str = "rb", *_: Any, **__: Any) -> Any:
    import fsspec

    return fsspec.open(url, mode, **options).open()


def read_webdataset(workload: str, url: str, workers: int, options: Any = None) -> Any:
    import webdataset as wds

    # webdataset opens URLs through its gopen table (pipe:, http, gs, ...): s3:// through fsspec
    gopen_schemes = sys.modules["webdataset.gopen"].gopen_schemes
    gopen_schemes["s3"] = functools.partial(_fsspec_open, options or {})
    ds = (
        wds.WebDataset(
            list_tars(url, options or {}),
            shardshuffle=WDS_SHARD_SHUFFLE,
            seed=0,
            workersplitter=wds.split_by_worker,
        )
        .shuffle(WDS_BUFFER)
        .decode()
        .batched(
            BATCH,
            collation_fn=functools.partial(
                systems.collate_decoded_meta, workload, suffix=".npy", meta="meta.json"
            ),
            partial=True,
        )
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


def _s3fs_taking_block_size() -> None:
    """datasets streams a tar with ``xopen(url, block_size=0)``, which reaches the filesystem's
    constructor; s3fs has no such argument and hands it to aiobotocore, which fails (datasets
    5.0 with s3fs 2026.6). Registered for ``s3`` in the HF run only: the same s3fs, the
    argument dropped."""
    import fsspec
    import s3fs

    class S3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
        def __init__(self, *args: Any, block_size: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    fsspec.register_implementation("s3", S3FileSystem, clobber=True)


def read_hf(workload: str, url: str, workers: int, options: Any = None) -> Any:
    import datasets
    from torch.utils.data import DataLoader

    datasets.disable_progress_bars()
    _s3fs_taking_block_size()
    ds = datasets.load_dataset(
        "webdataset",
        data_files={"train": list_tars(url, options or {})},
        split="train",
        streaming=True,
        storage_options=options,
    )
    ds = ds.shuffle(seed=0, buffer_size=HF_BUFFER)
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=functools.partial(
            systems.collate_decoded_meta, workload, suffix=".npy", meta="meta.json"
        ),
    )


READ = {
    "ours": read_ours,
    "ours_cache": read_ours_cache,
    "ours_obstore": read_ours_obstore,
    "litdata": read_litdata,
    "mosaic": read_mosaic,
    "webdataset": read_webdataset,
    "hf": read_hf,
}
# the format (the folder on the server) each system reads
FORMAT = {
    "ours": "ours",
    "ours_cache": "ours",
    "ours_obstore": "ours",
    "litdata": "litdata",
    "mosaic": "mosaic",
    "webdataset": "webdataset",
    "hf": "webdataset",
}
TITLES = {
    **systems.TITLES,
    "ours_cache": "wdsloader with cache_dir",
    "ours_obstore": "wdsloader, obstore transport",
}
