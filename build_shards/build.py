"""``build_shards``: source -> (key, sample) -> map -> split -> encode -> shards + idx -> manifest."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from build_shards.encode import SampleEncoder, build_schema
from build_shards.errors import BuildError, BuildWorkerError, SourceChangedError, naming_options
from build_shards.lock import DEFAULT_LOCK_TIMEOUT, BuildLock, OutputLockedError
from build_shards.pool import refuse_reimported_main, run_pool
from build_shards.sources import Source, open_source
from build_shards.splits import make_splitter
from build_shards.state import OutputState
from build_shards.writer import BlockJob, item_digest, prepare, run_block
from wdsloader.errors import SchemaError
from wdsloader.format import FORMAT_VERSION, FieldSpec, Manifest, ShardInfo, SplitInfo
from wdsloader.io.storage import url_to_fs

log = logging.getLogger("build_shards")

BLOCK_FACTOR = 4  # default block_size = BLOCK_FACTOR * shard_max_count
Progress = bool | Callable[[int, int], None]


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
) -> Manifest:
    """Write ``source`` as WebDataset tar shards with ``.tar.idx`` files and ``manifest.json``.

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

    The schema is inferred from the first sample (after ``map``); ``schema`` declares fields
    (``FieldSpec`` or dict, symbolic dims bound by ``dims`` or by the first sample); every sample
    is checked against it. NaN/Inf is a SchemaError unless ``allow_nan`` (then counted in
    ``manifest.build["nan_samples"]``).

    Shards: the source is cut into blocks of ``block_size`` consecutive items (default
    ``4 * shard_max_count``); each block writes ``{split}/shard-BBBBB-PPP.tar`` bounded by
    ``shard_max_count`` samples and ``shard_max_bytes`` file bytes (a bigger sample gets a shard
    of its own). The layout depends on the data and these options only, never on ``workers``
    (local processes; indexable sources are read by the workers, sequential ones by this
    process). ``manifest.json`` is written last.

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

    ``progress``: True for a tqdm bar, or a callable ``(items_done, items_total_or_0)``.
    """
    refuse_reimported_main()
    _check_options(shard_max_count, shard_max_bytes, block_size, workers, key_field)
    if lock_timeout is not None and (isinstance(lock_timeout, bool) or not lock_timeout > 0):
        raise ValueError(f"lock_timeout must be a positive number or None, got {lock_timeout!r}")
    output_url = os.fspath(output)
    fs, root = url_to_fs(output_url, storage_options)
    if workers > 1 and "memory" in _protocols(fs):
        raise BuildError("memory:// lives in one process: use workers=1 for a memory:// output")
    state = OutputState(fs, root, output_url, storage_options)
    state.check_existing(overwrite)

    src = open_source(source)
    splitter = make_splitter(
        src, splits=splits, split_field=split_field, group_by=group_by, seed=seed
    )
    block_size = block_size or BLOCK_FACTOR * shard_max_count
    job = BlockJob(
        source=None,
        decoder=src.decoder,
        map_fn=map,
        key_field=key_field,
        splitter=splitter,
        encoder=None,  # type: ignore[arg-type]  # set once the schema is known
        shard_max_count=shard_max_count,
        shard_max_bytes=shard_max_bytes,
        fingerprint="",
    )
    stream, (key, sample) = _first_sample(src, job)
    full_schema, all_dims = build_schema(key, sample, schema, dims)
    encoder = SampleEncoder(full_schema, all_dims, allow_nan=allow_nan)
    encoder.encode(key, sample)  # the first sample must pass its own schema (NaN, ranges)
    defaults = dict(loader_defaults or {})
    if curriculum is not None:
        defaults["curriculum"] = _curriculum_dict(curriculum, full_schema, all_dims)

    options = {
        "format_version": FORMAT_VERSION,
        "source": src.describe(),
        "map": _callable_name(map),
        "key_field": key_field,
        "splits": splitter.spec(),
        "seed": seed,
        "shard_max_count": shard_max_count,
        "shard_max_bytes": shard_max_bytes,
        "block_size": block_size,
        "allow_nan": allow_nan,
        "schema": {f: _spec_dict(s) for f, s in full_schema.items()},
        "dims": all_dims,
    }
    options = json.loads(json.dumps(options, default=str))
    fingerprint = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()
    job = dataclasses.replace(
        job,
        encoder=encoder,
        fingerprint=fingerprint,
        source=src if src.indexable and not src.in_memory else None,
    )
    build_info = {
        "builder": "build_shards",
        "seed": seed,
        "shard_max_count": shard_max_count,
        "shard_max_bytes": shard_max_bytes,
        "block_size": block_size,
        "splits": splitter.spec(),
        "group_by": group_by,
        "split_field": split_field,
        "key_field": key_field,
        "allow_nan": allow_nan,
    }
    lock = BuildLock(
        fs, root, output_url, fingerprint=fingerprint, timeout=lock_timeout, break_lock=break_lock
    )
    with lock:
        state.check_existing(overwrite, fingerprint)
        completed = state.resume(fingerprint, options, overwrite)
        job = dataclasses.replace(job, prefix=state.prefix)
        stream = _check_kept(job, src, stream, completed, state.url)
        state.clear_temporary()
        bar = _ProgressBar(progress, src.length)
        try:
            records = _run_blocks(
                job, src, stream, completed, block_size, workers, fs, root, output_url,
                storage_options, bar,
            )  # fmt: skip
            manifest = _merge(records, splitter.names, state)
            manifest.schema = dict(full_schema)
            manifest.dims = dict(all_dims)
            manifest.loader_defaults = defaults
            manifest.build = _build_record(build_info, records, src.kind)
            lock.check()
            state.finalize(manifest)
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


def _build_record(
    build_info: dict[str, Any], records: Mapping[int, Any], kind: str
) -> dict[str, Any]:
    """``manifest.build``: the build's parameters and counts."""
    total_nan = sum(r["nan_samples"] for r in records.values())
    if total_nan:
        log.warning("%d samples hold NaN or Inf values (allow_nan=True)", total_nan)
    return {
        **build_info,
        "nan_samples": total_nan,
        "dropped_by_map": sum(r["skipped"] for r in records.values()),
        "source": {"kind": kind, "num_items": sum(r["num_items"] for r in records.values())},
        "num_blocks": len(records),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _note_resumable(exc: OSError, url: str, replaces: bool) -> None:
    """Tell the caller of an I/O error that the finished blocks are kept and how to resume."""
    how = (
        "with the same options but without overwrite=True" if replaces else "with the same options"
    )
    exc.add_note(f"finished blocks are kept in {url}: rerun {how} to resume")
    exc.resumable = True  # type: ignore[attr-defined]
    naming_options(exc, "overwrite")


# ------------------------------------------------------------------------------------------------
# Resume: the kept blocks must come from the same data
# ------------------------------------------------------------------------------------------------


def _check_kept(
    job: BlockJob,
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, Any],
    url: str,
) -> Iterator[tuple[int, Any]] | None:
    """Compare each kept block's first and last items with the source (their key, split and
    encoded bytes): an indexable source now, before anything is written; a stream as it passes
    (the returned stream raises). A mismatch raises SourceChangedError."""
    if not completed or stream is not None:
        return _checked_stream(job, stream, completed, url) if completed else stream
    for block, rec in sorted(completed.items()):
        for end in ("first", "last"):
            i = rec[end]["index"]
            for index, raw in src.iter_range(i, i + 1):
                _compare(job, block, rec, end, index, raw, url)
    return None


def _checked_stream(
    job: BlockJob,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, Any],
    url: str,
) -> Iterator[tuple[int, Any]]:
    assert stream is not None
    checks: dict[int, list[tuple[int, str]]] = {}
    for block, rec in completed.items():
        for end in ("first", "last"):
            checks.setdefault(rec[end]["index"], []).append((block, end))
    for index, raw in stream:
        for block, end in checks.pop(index, ()):
            _compare(job, block, completed[block], end, index, raw, url)
        yield index, raw
    if checks:
        index = min(checks)
        block, end = checks[index][0]
        raise naming_options(
            SourceChangedError(
                f"{url}: the source ended before item {index}, the {end} item of the unfinished "
                f"build's finished block {block}: it is not the data that block was written "
                "from. Resuming would mix old and new samples: pass overwrite=True to start over"
            ),
            "overwrite",
        )


def _compare(
    job: BlockJob, block: int, rec: Mapping[str, Any], end: str, index: int, raw: Any, url: str
) -> None:
    key, digest = item_digest(job, index, raw)
    want = rec[end]
    if digest == want["digest"]:
        return
    if key != want["key"]:
        what = f"its key is {key!r}, the block holds {want['key']!r}"
    else:
        what = f"sample {key!r} has other content or split than the block holds"
    raise naming_options(
        SourceChangedError(
            f"{url}: finished block {block} of the unfinished build (source items "
            f"{rec['start']}-{rec['stop'] - 1}) was written from other data: source item {index}, "
            f"the block's {end} item, differs ({what}). Resuming would mix old and new samples: "
            "pass overwrite=True to start over"
        ),
        "overwrite",
    )


# ------------------------------------------------------------------------------------------------
# Steps
# ------------------------------------------------------------------------------------------------


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


def _check_options(
    shard_max_count: int, shard_max_bytes: int, block_size: int | None, workers: int, key_field: str
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


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _spec_dict(spec: FieldSpec) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}


def _first_sample(
    src: Source, job: BlockJob
) -> tuple[Iterator[tuple[int, Any]] | None, tuple[str, dict[str, Any]]]:
    """The first sample map keeps, and for a sequential source the stream to build from (the
    items read so far put back in front)."""
    it = src.iter_range(0, src.length if src.indexable else None)
    seen: list[tuple[int, Any]] = []
    found = None
    for index, raw in it:
        if not src.indexable:
            seen.append((index, raw))
        prepared = prepare(job, index, raw)
        if prepared is not None:
            key, _split, sample = prepared
            found = (key, sample)
            break
    if found is None:
        dropped = len(seen) if not src.indexable else src.length
        if dropped:
            raise BuildError(f"source is empty after map: it dropped all {dropped} items")
        raise BuildError("source is empty")
    stream = None if src.indexable else itertools.chain(seen, it)
    return stream, found


def _blocks(
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: Mapping[int, Any],
    block_size: int,
    bar: _ProgressBar,
) -> Iterator[tuple[int, int, int | None, Iterator[tuple[int, Any]] | None]]:
    """``(block, start, stop, items)`` for the blocks to build; ``items`` is None when the
    worker reads the range itself. Finished blocks are skipped (a stream is still read past)."""
    if stream is None:
        assert src.length is not None
        for b in range(math.ceil(src.length / block_size)):
            if b in completed:
                bar.update(completed[b]["num_items"], 0)
                continue
            start, stop = b * block_size, min(src.length, (b + 1) * block_size)
            yield b, start, stop, src.iter_range(start, stop) if src.in_memory else None
        return
    for b in itertools.count():
        head = next(stream, None)
        if head is None:
            return
        items = itertools.chain([head], itertools.islice(stream, block_size - 1))
        if b in completed:
            deque(items, maxlen=0)
            bar.update(completed[b]["num_items"], 0)
            continue
        yield b, b * block_size, None, items


def _run_blocks(
    job: BlockJob,
    src: Source,
    stream: Iterator[tuple[int, Any]] | None,
    completed: dict[int, Any],
    block_size: int,
    workers: int,
    fs: Any,
    root: str,
    output_url: str,
    storage_options: dict[str, Any] | None,
    bar: _ProgressBar,
) -> dict[int, Any]:
    """Build every unfinished block, inline or in worker processes; all records by block."""
    records = {b: _compact(rec) for b, rec in completed.items()}
    blocks = _blocks(src, stream, completed, block_size, bar)
    if workers == 1:
        for b, start, stop, items in blocks:
            it = items if items is not None else src.iter_range(start, stop)
            records[b] = _compact(run_block(job, fs, root, b, start, it, report=bar.update))
        return records
    report = bar.update if bar.active else None
    for b, rec in run_pool(job, blocks, workers, fs, root, output_url, storage_options, report):
        records[b] = _compact(rec)
    return records


def _compact(rec: dict[str, Any]) -> dict[str, Any]:
    """Replace a record's key lists by arrays of their hashes (8 bytes a key) to check
    duplicates across blocks at the end; the keys stay on disk in the block's record."""
    keys = rec.pop("keys", {})
    rec["key_hashes"] = {
        split: np.fromiter(map(hash, ks), np.int64, len(ks)) for split, ks in keys.items()
    }
    return rec


def _merge(records: Mapping[int, Any], names: tuple[str, ...], state: OutputState) -> Manifest:
    """The manifest's splits from the block records, in block order; duplicate keys refused."""
    splits: dict[str, SplitInfo] = {name: SplitInfo() for name in names}
    hashes: dict[str, list[np.ndarray]] = {}
    owners: dict[str, list[tuple[int, int]]] = {}
    for b in sorted(records):
        rec = records[b]
        for split, shards in rec["splits"].items():
            splits.setdefault(split, SplitInfo()).shards.extend(ShardInfo(**s) for s in shards)
        for split, arr in rec["key_hashes"].items():
            hashes.setdefault(split, []).append(arr)
            owners.setdefault(split, []).append((b, len(arr)))
    for split, parts in hashes.items():
        _check_duplicates(split, parts, owners[split], state)
    if not any(s.num_samples for s in splits.values()):
        raise BuildError("no samples were written (map dropped every item)")
    return Manifest(splits=splits)


def _check_duplicates(
    split: str, parts: list[np.ndarray], owners: list[tuple[int, int]], state: OutputState
) -> None:
    """Raise a BuildError naming a key that two blocks of ``split`` share."""
    if len(parts) < 2:
        return
    allh = np.concatenate(parts)
    order = np.sort(allh)
    dup = np.unique(order[1:][order[1:] == order[:-1]])
    if not dup.size:
        return
    blocks = np.repeat([b for b, _ in owners], [n for _, n in owners])
    suspects = np.unique(blocks[np.isin(allh, dup)])
    seen: set[str] = set()
    dupset = set(dup.tolist())
    for b in suspects.tolist():
        for key in state.record_keys(int(b)).get(split, []):
            if hash(key) in dupset:
                if key in seen:
                    raise BuildError(f"duplicate key {key!r} in split {split!r}")
                seen.add(key)


class _ProgressBar:
    """tqdm bar (items/s and MB), a callable ``(done, total)``, or nothing."""

    def __init__(self, progress: Progress, total: int | None) -> None:
        self.active = bool(progress)
        self.total = total or 0
        self.done = 0
        self.nbytes = 0
        self._callback = progress if callable(progress) else None
        self._bar = None
        self._t0 = time.monotonic()
        if progress is True:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="sample", unit_scale=True, desc="build-shards")

    def update(self, n: int, nbytes: int) -> None:
        self.done += n
        self.nbytes += nbytes
        if self._callback is not None:
            self._callback(self.done, self.total)
        if self._bar is not None:
            mb = self.nbytes / 1e6
            rate = mb / max(time.monotonic() - self._t0, 1e-9)
            self._bar.set_postfix_str(f"{mb:,.1f} MB, {rate:,.1f} MB/s", refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
