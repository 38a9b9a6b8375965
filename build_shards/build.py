"""``build_shards``: source -> (key, sample) -> map -> split -> encode -> shards + idx -> manifest.

The steps: check the options, open the source and infer the schema (:class:`Input`), take the
output's lock and resume what an unfinished build kept, run the blocks, merge their records into
the manifest and finalize the output.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from build_shards.commit.lock import DEFAULT_LOCK_TIMEOUT, BuildLock, OutputLockedError
from build_shards.commit.merge import manifest_build, merge
from build_shards.commit.resume import check_kept
from build_shards.commit.state import OutputState
from build_shards.encode.sample import SampleEncoder
from build_shards.encode.schema import with_small_fields_grouped
from build_shards.engines import Engine, Output, make_engine
from build_shards.engines.main_guard import refuse_unguarded_main
from build_shards.engines.pool import refuse_reimported_main
from build_shards.engines.run import Progress, ProgressBar, run_blocks
from build_shards.errors import BuildError, BuildWorkerError, SourceChangedError, naming_options
from build_shards.layout.params import (
    BuildParams,
    callable_name,
    default_block_size,
    sample_tar_bytes,
)
from build_shards.layout.splits import Splitter, make_splitter
from build_shards.probe.estimate import item_seconds
from build_shards.probe.infer import first_rows, infer_schema
from build_shards.sources import Source, open_source
from build_shards.write.blocks import BlockJob
from build_shards.write.records import BlockRecord
from build_shards.write.rests import Placed, pack_rests
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, Manifest
from wdsloader.format.deflate import COMPRESSIONS
from wdsloader.io.storage import url_to_fs

log = logging.getLogger("build_shards")
# tar bytes per data byte above which the build suggests the small-record options
SUGGEST_RATIO = 4.0


def build_shards(
    source: Any,
    output: str | os.PathLike[str],
    *,
    splits: Mapping[str, float] | None = None,
    split_field: str | None = None,
    group_by: str | None = None,
    key_field: str = "__key__",
    schema: Mapping[str, FieldSpec | Mapping[str, Any]] | None = None,
    dims: Mapping[str, int] | None = None,
    map: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    shard_max_count: int = 10_000,
    shard_max_bytes: int = 256 * 2**20,
    block_size: int | None = None,
    workers: int = 1,
    seed: int = 0,
    allow_nan: bool = False,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    loader_defaults: Mapping[str, Any] | None = None,
    curriculum: Any = None,
    progress: Progress = False,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    break_lock: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    compression: str | None = None,
    group_small_fields: bool = False,
    build_record: Callable[[], Mapping[str, Any]] | None = None,
) -> Manifest:
    """Write ``source`` as WebDataset tar shards with their indexes and ``manifest.json``.

    ``source``: a ``datasets`` Dataset/DatasetDict (its splits kept)/IterableDataset, a torch
    map-style or iterable Dataset, a list/tuple/iterator of dicts, or paths (a path, a glob or a
    list) of ``.jsonl`` files or plain text files (documents separated by blank lines become
    ``{"text": doc}``). ``output``: a folder or any fsspec URL (``memory://``, ``s3://``).

    Each item is a dict of fields; its key is ``item[key_field]`` or the zero-padded source index.
    ``map(sample) -> sample`` runs on every item (it sees the key under ``key_field`` and may
    change it; returning None drops the item); it must be deterministic, and picklable (a
    module-level function) when ``workers > 1``. Splits: ``splits={"train": 0.8, ...}`` by a
    hash of the key (or of the ``group_by`` field) and ``seed``, or ``split_field`` (the field
    names the split and is not stored), or the DatasetDict's splits; else all in ``train``.

    The schema is inferred from the first samples (after ``map``; up to 1,000: a field absent or
    None in some is ``optional``, ints mixed with floats are floats; see
    :mod:`build_shards.probe.infer`); ``schema`` declares fields (``FieldSpec`` or dict such as
    ``{"score": {"encoding": "json", "optional": True}}``, symbolic dims bound by ``dims`` or by
    the first samples); every sample is checked against it. NaN/Inf is a SchemaError unless ``allow_nan`` (then counted in
    ``manifest.build["nan_samples"]``).

    Shards: the source is cut into blocks of ``block_size`` consecutive items (default: at most
    4 full shards, judged by the first sample's size, and at least 16 blocks when the source's
    length is known, a block keeping >= 4 MiB or one full shard: see
    :func:`build_shards.layout.params.default_block_size`); each block writes
    ``{split}/{split}-BBBBB-PPP.tar`` bounded by
    ``shard_max_count`` samples and ``shard_max_bytes`` file bytes (a bigger sample gets a shard
    of its own); its small last shard of a split is packed with the other blocks' at the end
    (:mod:`build_shards.write.rests`), so each split has at most one small shard. The layout depends
    on the data and these options only, never on ``workers`` (at most that many local
    processes; a build estimated under 2 s of work runs in this process, see
    :data:`build_shards.engines.local.SMALL_BUILD_S`; indexable sources are read by the
    workers, sequential ones by this process). ``workers > 1`` called from a main script's top
    level without an ``if __name__ == "__main__":`` guard is a BuildError at once (workers
    import the script again). ``manifest.json`` is written last.

    Failures: finished blocks are recorded under ``OUTPUT/_build/``. A user error (BuildError,
    SchemaError) removes what the unfinished build wrote; after a crash or any other error (an
    ``OSError`` such as a full disk carries a note saying the blocks are kept), a rerun with the
    same options keeps every block whose first and last items still match the source (else
    :class:`SourceChangedError`: resuming would mix old and new samples). A complete dataset in
    ``output`` is refused unless ``overwrite``, which starts over: the new shards are written
    beside the old dataset, which stays readable until the new manifest replaces it (then its
    files are removed); an unfinished overwrite is resumed by a rerun without ``overwrite``.

    One build at a time per output: ``OUTPUT/_build.lock`` (an exclusive create) makes a second
    build raise :class:`OutputLockedError` before it touches anything. A lock whose build is
    gone (a dead process of this host, or nothing finished for ``lock_timeout`` seconds; None:
    never) is taken over; ``break_lock=True`` takes any lock.

    ``curriculum`` (a :class:`wdsloader.Curriculum` or its dict) is stored as the loader's
    default (``loader_defaults["curriculum"]``) after checking its variant fields against the
    schema (ValueError before anything is written).

    ``engine``: ``"local"`` (this process, or ``workers`` local processes) or ``"ray"``: one Ray
    task per block on the cluster at ``ray_address`` (None: the cluster ``ray.init()`` finds, or
    a local one; an already initialised Ray is used as is). Each task reads its block's range of
    the source itself and writes its shards straight to ``output`` (so the output must be
    reachable from every node, e.g. ``s3://``); the shards are byte-identical to the local
    engine's. Ray reads a ``datasets`` Dataset/DatasetDict, a torch map-style Dataset, or JSONL
    and text files (indexed by one task per file first); a list, iterator or iterable dataset
    lives in this process and is refused (BuildError). Ray retries a task that raised an
    ``OSError`` or whose worker died; a block written twice is the same bytes.

    ``progress``: True for a tqdm bar, or a callable ``(items_done, items_total_or_0)``; the
    total of local uncompressed JSONL files is their number of lines (blank ones included).

    Small records: ``group_small_fields=True`` writes a sample's small scalar fields (ints,
    JSON scalars, strings of up to 512 bytes) as one member ``KEY.fields.json`` (the loader
    still yields each field; see :mod:`wdsloader.format.groups`); ``compression="gzip"``
    writes ``.tar.gz`` shards whose samples the loader still reads one by one (see
    :mod:`wdsloader.format.deflate`; ``shard_max_bytes`` is then judged before compression).

    ``build_record`` (for builders on top of this one, e.g. the text builder): called once the
    source is consumed; its entries join ``manifest.build`` before the manifest is written.
    """
    refuse_reimported_main()
    _check_options(shard_max_count, shard_max_bytes, block_size, workers, key_field, lock_timeout)
    if workers > 1 and engine == "local":
        refuse_unguarded_main(workers)
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(f"compression must be None or one of {COMPRESSIONS}, got {compression!r}")
    with closing(make_engine(engine, workers=workers, ray_address=ray_address)) as runner:
        out = _open_output(output, storage_options, runner)
        state = OutputState(out.fs, out.root, out.url, storage_options)
        state.check_existing(overwrite)
        given = open_source(source)
        inp = _open_input(
            runner.prepare(given), length=given.length, splits=splits, split_field=split_field,
            group_by=group_by, key_field=key_field, schema=schema, dims=dims, map_fn=map,
            seed=seed, allow_nan=allow_nan, shard_max_count=shard_max_count,
            shard_max_bytes=shard_max_bytes,
            block_size=block_size, compression=compression, group_small=bool(group_small_fields),
            measure=runner.name == "local" and not runner.single_process,
        )  # fmt: skip
        defaults = dict(loader_defaults or {})
        if curriculum is not None:
            defaults["curriculum"] = _curriculum_dict(
                curriculum, inp.params.schema, inp.params.dims
            )
        fingerprint = inp.job.fingerprint
        lock = BuildLock(
            out.fs, out.root, out.url, fingerprint=fingerprint, timeout=lock_timeout,
            break_lock=break_lock,
        )  # fmt: skip
        with lock:
            job, stream, completed = _resume(state, inp, overwrite)
            hint = given.count_hint()
            bar = ProgressBar(progress, inp.src.length or hint)
            if hint is not None and inp.item_seconds:
                left = hint - sum(rec.num_items for rec in completed.values())
                runner.expect(max(0, left) * inp.item_seconds)
            try:
                records = run_blocks(
                    job, inp.src, stream, completed, inp.params.block_size, runner, out, bar
                )
                packed = pack_rests(records, job, out.fs, out.root)
                manifest = _manifest(records, packed, inp, state, defaults)
                if build_record is not None:
                    manifest.build.update(build_record())
                lock.check()
                state.finalize(manifest)
                bar.complete()
            except (OutputLockedError, SourceChangedError, BuildWorkerError):
                raise  # not this build's files to remove (or a clear refusal: keep them)
            except (BuildError, SchemaError):  # user errors: the data or options must change
                state.discard()
                raise
            except OSError as exc:
                _note_resumable(exc, state.url, state.replaces)
                raise
            finally:
                bar.close()
    return manifest


@dataclass(frozen=True, slots=True)
class Input:
    """The opened source with what the build learnt from its first sample."""

    src: Source
    splitter: Splitter
    stream: Iterator[tuple[int, Any]] | None  # a sequential source's items (None: indexable)
    params: BuildParams
    job: BlockJob  # without the shard name prefix, known once the output's state is read
    item_seconds: float  # what an item costs, measured on a few (build_shards.probe.estimate)


def _check_options(
    shard_max_count: int,
    shard_max_bytes: int,
    block_size: int | None,
    workers: int,
    key_field: str,
    lock_timeout: float | None,
) -> None:
    for name, value in (
        ("shard_max_count", shard_max_count),
        ("shard_max_bytes", shard_max_bytes),
        ("workers", workers),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
    ):
        raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
    if not isinstance(key_field, str) or not key_field:
        raise ValueError(f"key_field must be a non-empty string, got {key_field!r}")
    if lock_timeout is not None and (isinstance(lock_timeout, bool) or not lock_timeout > 0):
        raise ValueError(f"lock_timeout must be a positive number or None, got {lock_timeout!r}")


def _open_output(
    output: str | os.PathLike[str], storage_options: dict[str, Any] | None, runner: Engine
) -> Output:
    url = os.fspath(output)
    fs, root = url_to_fs(url, storage_options)
    if "memory" in _protocols(fs) and not runner.single_process:
        if runner.name == "local":
            raise BuildError("memory:// lives in one process: use workers=1 for a memory:// output")
        raise BuildError(
            f"memory:// lives in one process: engine={runner.name!r} writes from other processes "
            "(use a folder every node reaches, or s3://)"
        )
    return Output(fs, root, url, storage_options)


def _open_input(
    src: Source,
    *,
    length: int | None,
    splits: Mapping[str, float] | None,
    split_field: str | None,
    group_by: str | None,
    key_field: str,
    schema: Mapping[str, FieldSpec | Mapping[str, Any]] | None,
    dims: Mapping[str, int] | None,
    map_fn: Callable[[dict[str, Any]], dict[str, Any]] | None,
    seed: int,
    allow_nan: bool,
    shard_max_count: int,
    shard_max_bytes: int,
    block_size: int | None,
    compression: str | None = None,
    group_small: bool = False,
    measure: bool = False,
) -> Input:
    """Infer the schema from the source's first samples and check the first (and with
    ``measure``, time a few more). ``length``: the source's as given, before the engine
    prepared it (the default block size depends on it, so every engine writes the same
    shards)."""
    splitter = make_splitter(
        src, splits=splits, split_field=split_field, group_by=group_by, seed=seed
    )
    job = BlockJob(
        source=None,
        decoder=src.decoder,
        map_fn=map_fn,
        key_field=key_field,
        splitter=splitter,
        encoder=None,  # type: ignore[arg-type]  # set once the schema is known
        shard_max_count=shard_max_count,
        shard_max_bytes=shard_max_bytes,
        fingerprint="",
    )
    stream, rows = first_rows(src, job)
    full_schema, all_dims = infer_schema(rows, schema, dims)
    key, sample = rows[0]
    del rows
    if group_small:
        full_schema = with_small_fields_grouped(full_schema, sample)
    encoder = SampleEncoder(full_schema, all_dims, allow_nan=allow_nan)
    members, _ = encoder.encode(key, sample)  # the first sample must pass its schema (NaN, ranges)
    if compression is None:
        _suggest_small_record_options(members, group_small)
    if block_size is None:
        block_size = default_block_size(
            length, sample_tar_bytes(members), shard_max_count, shard_max_bytes
        )
    params = BuildParams(
        source=src.describe(), source_kind=src.kind, map_name=callable_name(map_fn),
        key_field=key_field, splits=splitter.spec(), split_field=split_field, group_by=group_by,
        seed=seed, shard_max_count=shard_max_count, shard_max_bytes=shard_max_bytes,
        block_size=block_size, allow_nan=allow_nan, schema=full_schema, dims=all_dims,
        compression=compression,
    )  # fmt: skip
    job = dataclasses.replace(
        job,
        encoder=encoder,
        compression=compression,
        fingerprint=params.fingerprint(),
        source=src if src.indexable and not src.in_memory else None,
    )
    cost, stream = item_seconds(job, src, stream) if measure else (0.0, stream)
    return Input(src, splitter, stream, params, job, cost)


def _resume(
    state: OutputState, inp: Input, overwrite: bool
) -> tuple[BlockJob, Iterator[tuple[int, Any]] | None, dict[int, BlockRecord]]:
    """Under the lock: the job with its shard name prefix, the stream to build from (checking
    the kept blocks as it passes) and the finished blocks kept from an unfinished build."""
    fingerprint = inp.job.fingerprint
    state.check_existing(overwrite, fingerprint)
    completed = state.resume(fingerprint, inp.params.options(), overwrite)
    job = dataclasses.replace(inp.job, prefix=state.prefix)
    stream = check_kept(job, inp.src, inp.stream, completed, state.url)
    state.clear_temporary()
    return job, stream, completed


def _manifest(
    records: Mapping[int, BlockRecord],
    packed: Mapping[str, list[Placed]],
    inp: Input,
    state: OutputState,
    defaults: dict[str, Any],
) -> Manifest:
    """The manifest of the finished build."""
    manifest = merge(records, inp.splitter.names, state, packed)
    manifest.schema = dict(inp.params.schema)
    manifest.dims = dict(inp.params.dims)
    manifest.loader_defaults = defaults
    manifest.build = manifest_build(inp.params, records)
    for split in manifest.splits.values():  # block records do not keep it: one for all shards
        for shard in split.shards:
            shard.compression = inp.params.compression
    return manifest


def _suggest_small_record_options(members: list[tuple[str, bytes]], grouped: bool) -> None:
    """Log one INFO line when the first sample takes over :data:`SUGGEST_RATIO` times its data
    bytes in the tar (headers and padding of small members)."""
    data = sum(len(d) for _, d in members)
    tar = sample_tar_bytes(members)
    if tar > SUGGEST_RATIO * max(data, 1):
        options = (
            "compression='gzip'" if grouped else "group_small_fields=True and compression='gzip'"
        )
        log.info(
            "each sample takes %d tar bytes for %d bytes of data (%.0fx: small fields, each a "
            "member with a 512-byte header and padding); %s make such shards much smaller "
            "(CLI: --group-small-fields, --compression gzip)",
            tar, data, tar / max(data, 1), options,
        )  # fmt: skip


def _note_resumable(exc: OSError, url: str, replaces: bool) -> None:
    """Tell the caller of an I/O error that the finished blocks are kept and how to resume."""
    how = (
        "with the same options but without overwrite=True" if replaces else "with the same options"
    )
    # BaseException.add_note from Python 3.11; the same list by hand on 3.10
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        exc.__notes__ = notes  # type: ignore[attr-defined]
    notes.append(f"finished blocks are kept in {url}: rerun {how} to resume")
    exc.resumable = True  # type: ignore[attr-defined]
    naming_options(exc, "overwrite")


def _curriculum_dict(
    curriculum: Any, schema: Mapping[str, FieldSpec], dims: Mapping[str, int]
) -> dict[str, Any]:
    """The curriculum as stored in the manifest, checked against the dataset's schema."""
    from wdsloader.curriculum import Curriculum

    if isinstance(curriculum, Mapping):
        curriculum = Curriculum.from_dict(curriculum)
    if not isinstance(curriculum, Curriculum):
        raise TypeError(f"curriculum must be a wdsloader.Curriculum or a dict, got {curriculum!r}")
    curriculum.output_specs(schema, dims)
    return curriculum.to_dict()


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
