"""What ``create_loader`` opens before planning: the store and manifest of a dataset (or of
each source of a mix), and the lengths of its documents when a token-weighted mix plans with
them."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from wdsloader.curriculum.curriculum import stored_curriculum
from wdsloader.errors import ManifestError
from wdsloader.format import Manifest, ShardInfo
from wdsloader.io.fetch import ReadOptions, ShardStore
from wdsloader.io.manifest_io import load_manifest, manifest_where
from wdsloader.io.side_files import read_split_lengths
from wdsloader.io.store import open_store
from wdsloader.stream.start_method import start_method

if TYPE_CHECKING:
    from wdsloader.mix.spec import MixSpec
    from wdsloader.mix.store import MixStore
    from wdsloader.stream.loader_options import LoaderOptions


def open_dataset(
    root: str, options: ReadOptions, check_shards: bool, split: str, reads_here: bool = False
) -> tuple[ShardStore, Manifest]:
    """The store over ``root`` and its manifest (read under the options' timeouts; its default
    curriculum checked). ``reads_here``: this process forks no workers (it reads the shards
    itself, or its workers are spawned), so the manifest and indexes are read with the shards' client (obstore's
    where it reads them: no s3fs set up)."""
    store = open_store(root, options)
    store.reads_here = reads_here
    # remotely the manifest comes through the store's client (set up once per process)
    read = None if store.is_local else store.read_root_file
    try:
        storage_options = options.storage_options_for(root)
        manifest = load_manifest(root, storage_options, read=read)
        stored_curriculum(manifest.loader_defaults, manifest_where(root, storage_options))
    except ManifestError as exc:  # its message shows the root as given, userinfo included
        raise ManifestError(store.redact(exc)) from None
    # the indexes read once, in parallel, not again in each worker; the listing of the check
    # in flight with them
    store.open_split(manifest.split(split).shards, check_shards)
    return store, manifest


def read_source_lengths(options: ReadOptions, root: str, shards: Sequence[ShardInfo]) -> np.ndarray:
    """The lengths of ``shards``' samples under the dataset ``root`` (concatenated in order;
    read through a store, with its retries and deadline)."""
    store = open_store(root, options)
    try:
        return read_split_lengths(store, shards)
    finally:
        store.close()


def node_readers(world_size: int, num_workers: int) -> int:
    """The processes (or worker threads) of this node that read the dataset: its ranks
    (``LOCAL_WORLD_SIZE``, as torchrun sets it, when several ranks run) times each rank's
    DataLoader workers (at least one reader each)."""
    local = 1
    if world_size > 1:
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            local = 1
    return local * max(1, num_workers)


def share_node(store: object, readers: int) -> None:
    """Tell ``store`` (each source's store of a mix) how many readers share the node's link,
    so that each tunes its requests in flight and read-ahead to its share."""
    for each in getattr(store, "stores", [store]):
        if hasattr(each, "readers"):
            each.readers = readers


def open_source(
    root: str | None, options: LoaderOptions
) -> tuple[ShardStore | MixStore, Manifest, MixSpec | None]:
    """The store and manifest of the dataset at ``root``, or (``root`` None) of the mix of
    ``options``, with its spec."""
    read, check = options.read_options, options.errors.check_shards
    # no worker process forked from this one (none, threads, or spawned/forkserver ones): no
    # fork to keep obstore's runtime out of, so it reads the manifest and indexes too
    workers = options.workers
    here = options.num_workers == 0 or workers.mode == "thread"
    here = here or start_method(workers.multiprocessing_context) != "fork"
    if options.mix is None:
        assert root is not None
        return (*open_dataset(root, read, check, options.split, here), None)
    from wdsloader.mix.store import open_mix

    return open_mix(
        list(options.mix.sources), options.split, options.decode.fields,
        options.mix.spec_options(),
        lambda url: open_dataset(url, read, check, options.split, here),
        functools.partial(read_source_lengths, read),
    )  # fmt: skip
