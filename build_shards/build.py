"""``build_shards``: source -> (key, sample) -> map -> split -> encode -> shards + idx -> manifest.

The steps: resolve the options (:mod:`build_shards.resolve`), open the source and infer the schema (:class:`Input`), take the
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

from build_shards.commit.lock import BuildLock, OutputLockedError
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
from build_shards.options import (
    BuildOptions,
    EngineSpec,
    LoaderDefaults,
    LockOptions,
    SampleOptions,
    ShardOptions,
)
from build_shards.probe.estimate import item_seconds
from build_shards.probe.infer import first_rows, infer_schema
from build_shards.resolve import resolve_options
from build_shards.sources import Source, open_source
from build_shards.write.blocks import BlockJob
from build_shards.write.records import BlockRecord
from build_shards.write.rests import Placed, pack_rests
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec, Manifest
from wdsloader.io.storage import url_to_fs

log = logging.getLogger("build_shards")
# tar bytes per data byte above which the build suggests the small-record options
SUGGEST_RATIO = 4.0


def build_shards(
    source: Any,
    output: str | os.PathLike[str],
    *,
    splits: Mapping[str, float] | None = None,
    map: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    schema: Mapping[str, FieldSpec | Mapping[str, Any]] | None = None,
    workers: int = 1,
    seed: int = 0,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: Progress = False,
    engine: EngineSpec = "local",
    shards: ShardOptions | None = None,
    samples: SampleOptions | None = None,
    lock: LockOptions | None = None,
    defaults: LoaderDefaults | Mapping[str, Any] | None = None,
    **deprecated: Any,
) -> Manifest:
    """Write ``source`` as WebDataset tar shards with their indexes and ``manifest.json``.

    ``source``: a ``datasets`` Dataset/DatasetDict (its splits kept)/IterableDataset, a torch
    map-style or iterable Dataset, a ``ray.data`` Dataset (rows in its own order, see
    :mod:`build_shards.sources.raydata`), a list/tuple/iterator of dicts, or paths (a path, a
    glob or a list) of ``.jsonl`` files or plain text files (documents separated by blank lines
    become ``{"text": doc}``). ``output``: a folder or any fsspec URL (``memory://``, ``s3://``).

    Each item is a dict of fields, keyed as :class:`SampleOptions` (``samples=``) says.
    ``map(sample) -> sample`` runs on every item (returning None drops it); it must be
    deterministic, and picklable (a module-level function) when ``workers > 1``. Splits:
    ``splits={"train": 0.8, ...}`` by a hash of the key (or of ``samples.group_by``) and
    ``seed``, or ``samples.split_field``, or the DatasetDict's splits; else all in ``train``.
    The schema is inferred from the first samples (after ``map``, see
    :mod:`build_shards.probe.infer`); ``schema`` declares fields (``FieldSpec`` or dict such as
    ``{"score": {"encoding": "json", "optional": True}}``); every sample is checked against it.

    The shards' layout (:class:`ShardOptions`, ``shards=``) depends on the data and these
    options only, never on ``workers`` (at most that many local processes; a build estimated
    under 2 s of work runs in this process, see :data:`build_shards.engines.local.SMALL_BUILD_S`).
    ``workers > 1`` from a main script's top level without an ``if __name__ == "__main__":``
    guard is a BuildError. ``engine``: ``"local"``, or ``"ray"`` / :class:`RayEngine` (one Ray
    task per block, any source, ``map`` in the tasks, byte-identical shards). ``manifest.json``
    is written last, with ``defaults`` (:class:`LoaderDefaults` or a mapping) as the loader's
    defaults.

    Failures: finished blocks are recorded under ``OUTPUT/_build/``. A user error (BuildError,
    SchemaError) removes what the unfinished build wrote; after a crash or any other error (an
    ``OSError`` such as a full disk carries a note saying the blocks are kept), a rerun with the
    same options keeps every block whose first and last items still match the source (else
    :class:`SourceChangedError`). A complete dataset in ``output`` is refused unless
    ``overwrite``, which writes the new shards beside the old dataset (readable until the new
    manifest replaces it); an unfinished overwrite is resumed by a rerun without ``overwrite``.
    One build at a time per output (:class:`LockOptions`, ``lock=``): a second build raises
    :class:`OutputLockedError` before it touches anything.

    ``progress``: True for a tqdm bar, or a callable ``(items_done, items_total_or_0)``.
    The loose keywords of 0.1 (``shard_max_count=``, ``key_field=``, ``lock_timeout=``,
    ``ray_address=``, ``loader_defaults=``, ...; see :data:`build_shards.resolve.DEPRECATED`)
    still work with a DeprecationWarning naming their replacement, until 0.2.0.
    """
    options = resolve_options(
        dict(
            splits=splits, map=map, schema=schema, workers=workers, seed=seed,
            overwrite=overwrite, storage_options=storage_options, progress=progress,
            engine=engine, shards=shards, samples=samples, lock=lock, defaults=defaults,
            **deprecated,
        )
    )  # fmt: skip
    return run_build(source, output, options)


def run_build(
    source: Any,
    output: str | os.PathLike[str],
    options: BuildOptions,
    *,
    build_record: Callable[[], Mapping[str, Any]] | None = None,
) -> Manifest:
    """:func:`build_shards` with its options resolved. ``build_record`` (for builders on top of
    this one, e.g. the text builder): called once the source is consumed; its entries join
    ``manifest.build`` before the manifest is written."""
    refuse_reimported_main()
    if options.workers > 1 and options.engine == "local":
        refuse_unguarded_main(options.workers)
    with closing(make_engine(options.engine, workers=options.workers)) as runner:
        out = _open_output(output, options.storage_options, runner)
        state = OutputState(out.fs, out.root, out.url, options.storage_options)
        state.check_existing(options.overwrite)
        given = open_source(source)
        measure = runner.name == "local" and not runner.single_process
        inp = _open_input(runner.prepare(given), given.length, options, measure=measure)
        defaults = _loader_defaults(options.defaults, inp.params)
        lock = BuildLock(
            out.fs, out.root, out.url, fingerprint=inp.job.fingerprint,
            timeout=options.lock.timeout, break_lock=options.lock.break_lock,
        )  # fmt: skip
        with lock:
            job, stream, completed = _resume(state, inp, options.overwrite)
            hint = given.count_hint()
            bar = ProgressBar(options.progress, inp.src.length or hint)
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
    src: Source, length: int | None, options: BuildOptions, *, measure: bool = False
) -> Input:
    """Infer the schema from the source's first samples and check the first (and with
    ``measure``, time a few more). ``length``: the source's as given, before the engine
    prepared it (the default block size depends on it, so every engine writes the same
    shards)."""
    shards, samples, seed, map_fn = options.shards, options.samples, options.seed, options.map
    split_field, group_by, key_field = samples.split_field, samples.group_by, samples.key_field
    allow_nan, compression = samples.allow_nan, shards.compression
    shard_max_count, shard_max_bytes = shards.max_count, shards.max_bytes
    group_small, block_size = shards.group_small_fields, shards.block_size
    splitter = make_splitter(
        src, splits=options.splits, split_field=split_field, group_by=group_by, seed=seed
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
    full_schema, all_dims = infer_schema(rows, options.schema, samples.dims)
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
        compression=compression, lengths_field=samples.lengths,
    )  # fmt: skip
    job = dataclasses.replace(
        job,
        encoder=encoder,
        compression=compression,
        lengths_field=samples.lengths,
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
        fields = "compression='gzip'" if grouped else "group_small_fields=True, compression='gzip'"
        options = f"shards=ShardOptions({fields})"
        log.info(
            "each sample takes %d tar bytes for %d bytes of data (%.0fx: small fields, each a "
            "member with a 512-byte header and padding); %s makes such shards much smaller "
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


def _loader_defaults(defaults: LoaderDefaults, params: BuildParams) -> dict[str, Any]:
    """``manifest.loader_defaults``: the entries of ``defaults``, its curriculum checked against
    the dataset's schema (a ValueError before anything is written) and stored as its dict."""
    from wdsloader.curriculum import Curriculum

    entries = defaults.entries()
    curriculum = entries.get("curriculum")
    if curriculum is None:
        return entries
    if isinstance(curriculum, Mapping):
        curriculum = Curriculum.from_dict(curriculum)
    if not isinstance(curriculum, Curriculum):
        raise TypeError(f"curriculum must be a wdsloader.Curriculum or a dict, got {curriculum!r}")
    curriculum.output_specs(params.schema, params.dims)
    entries["curriculum"] = curriculum.to_dict()
    return entries


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
