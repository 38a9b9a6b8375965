"""The worker side of a build: turn one block of source items into finished shards and its record.

A block is a run of consecutive source indices. Each block writes its own shards per split
(see :mod:`build_shards.write.paths` for the names), bounded by ``shard_max_count`` samples and
``shard_max_bytes`` real file bytes; its small last shard of a split is a remainder (kept under
``_build/rest/``), packed with the other blocks' into full shards at the end of the build
(:mod:`build_shards.write.rests`). When all of a block's shards are committed, its record
``_build/block-BBBBB.json`` is written atomically: that record is what makes a rerun skip the
block. It also holds a digest of the block's first and last items (key, split and encoded
members), which a rerun compares with its own source before it keeps the block.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from build_shards.encode.sample import SampleEncoder
from build_shards.errors import BuildError, SampleKeyError
from build_shards.layout.splits import Splitter
from build_shards.write.paths import record_path
from build_shards.write.records import BlockEnd, BlockRecord
from build_shards.write.sink import Committer, ShardSink
from wdsloader.format import validate_key
from wdsloader.format.lengths import field_length
from wdsloader.io.storage import is_local, write_atomic

CHECK_EVERY = 64  # items between checks of the abort flag and progress reports
MAX_NAN_KEYS = 5  # keys of samples with NaN or Inf a record names

Item = tuple[int, "str | None", "str | None", list[tuple[str, bytes]]]  # index, key, split, members


@dataclass(slots=True, kw_only=True)
class BlockJob:
    """Everything a process needs to build blocks (sent once to each worker)."""

    source: Any  # an indexable Source, or None when the parent sends the items
    decoder: Callable[[Any], Any] | None
    map_fn: Callable[[dict[str, Any]], Any] | None
    key_field: str
    splitter: Splitter
    encoder: SampleEncoder
    shard_max_count: int
    shard_max_bytes: int
    fingerprint: str
    prefix: str = "{split}"  # of the shard file names (see SHARD_PREFIXES)
    compression: str | None = None  # of the shards (wdsloader.format.deflate)
    lengths_field: str | None = None  # whose length per sample the shards record


def prepare(job: BlockJob, index: int, raw: Any) -> tuple[str, str, dict[str, Any]] | None:
    """``(key, split, sample)`` for one source item: decode, key, ``map``, split assignment.

    The key is ``sample[key_field]`` when present, else the zero-padded source index; ``map``
    sees it under ``key_field`` and may change it; a ``map`` returning None drops the sample.
    """
    sample = job.decoder(raw) if job.decoder is not None else raw
    if type(sample) is not dict and not isinstance(sample, Mapping):
        raise BuildError(
            f"source item {index} is a {type(sample).__qualname__}, not a dict of fields"
        )
    sample = dict(sample)
    key = sample.pop(job.key_field, None)
    if key is None:
        key = f"{index:09d}"
    if job.map_fn is not None:
        sample[job.key_field] = key
        try:
            out = job.map_fn(sample)
        except Exception as exc:
            raise BuildError(
                f"map failed on source item {index} (key {key!r}): {type(exc).__name__}: {exc}"
            ) from exc
        if out is None:
            return None
        if not isinstance(out, Mapping):
            raise BuildError(
                f"map returned a {type(out).__qualname__} for source item {index}, not a dict"
            )
        sample = dict(out)
        key = sample.pop(job.key_field, key)
    key = _checked_key(job.key_field, index, key)
    split = job.splitter(index, key, sample)
    return key, split, sample


def _checked_key(key_field: str, index: int, key: Any) -> str:
    """``key`` as a str the shards can hold and readers give back unchanged, or
    :class:`SampleKeyError` naming the source item, the key and the key field."""
    where = f"source item {index}: field {key_field!r}"
    if isinstance(key, bytes):
        try:
            key = key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SampleKeyError(
                f"{where}: sample key {key!r} is not UTF-8 ({exc}); readers could not give it back"
            ) from None
    if not isinstance(key, str):
        raise SampleKeyError(f"{where}: key {key!r} is not a string")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SampleKeyError(f"{where}: sample key {key!r} is not valid Unicode ({exc})") from None
    try:
        validate_key(key)
    except ValueError as exc:
        raise SampleKeyError(f"{where}: {exc}") from None
    return key


def _length(sample: Mapping[str, Any], key: str, field: str) -> int:
    """The length of a sample's lengths field, or a BuildError naming the key and field."""
    try:
        return field_length(sample, key=key, field=field)
    except ValueError as exc:
        raise BuildError(str(exc)) from None


def sample_digest(key: str | None, split: str | None, members: list[tuple[str, bytes]]) -> str:
    """A digest of one item as a block stores it (key, split, encoded members); ``key`` None
    for an item ``map`` dropped."""
    h = hashlib.sha256()
    if key is None:
        h.update(b"dropped by map")
    else:
        h.update(f"{split}\0{key}\0".encode())
        for name, data in members:
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()[:32]


def item_digest(job: BlockJob, index: int, raw: Any) -> tuple[str | None, str]:
    """``(key, digest)`` of source item ``index`` as :func:`run_block` would store it."""
    prepared = prepare(job, index, raw)
    if prepared is None:
        return None, sample_digest(None, None, [])
    key, split, sample = prepared
    members, _ = job.encoder.encode(key, sample)
    return key, sample_digest(key, split, members)


class Aborted(Exception):
    """Raised in a worker when the build was stopped by another worker's error."""


class _BlockBuilder:
    """The state of one block while its items go in: its sinks per split, keys and counts."""

    def __init__(
        self,
        job: BlockJob,
        fs: Any,
        root: str,
        block: int,
        tmpdir: str | None,
        committer: Committer,
    ) -> None:
        self.job, self.fs, self.root, self.block = job, fs, root, block
        self.tmpdir, self.committer = tmpdir, committer
        self.sinks: dict[str, ShardSink] = {}
        self.keys: dict[str, list[str]] = {}
        self.seen: dict[str, set[str]] = {}
        self.num_items = self.skipped = self.nan_samples = 0
        self.nan_keys: list[str] = []
        self.first: BlockEnd | None = None
        self.last: Item | None = None

    def add(self, index: int, raw: Any) -> int:
        """Take one source item; the bytes it added to the shards."""
        self.num_items += 1
        added = 0
        prepared = prepare(self.job, index, raw)
        if prepared is None:
            self.skipped += 1
            self.last = (index, None, None, [])
        else:
            key, split, sample = prepared
            members, nonfinite = self.job.encoder.encode(key, sample)
            length = None
            if self.job.lengths_field is not None:
                length = _length(sample, key, self.job.lengths_field)
            sink = self.sinks.get(split) or self._open(split)
            if key in self.seen[split]:
                raise BuildError(f"duplicate key {key!r} in split {split!r}")
            self.seen[split].add(key)
            self.keys[split].append(key)
            added = sink.add(key, members, length=length)
            self.last = (index, key, split, members)
            if nonfinite:
                self.nan_samples += 1
                if len(self.nan_keys) < MAX_NAN_KEYS:
                    self.nan_keys.append(key)
        if self.first is None:
            self.first = block_end(self.last)
        return added

    def _open(self, split: str) -> ShardSink:
        job = self.job
        sink = self.sinks[split] = ShardSink(
            self.fs,
            self.root,
            split,
            self.block,
            max_count=job.shard_max_count,
            max_bytes=job.shard_max_bytes,
            tmpdir=self.tmpdir,
            committer=self.committer,
            prefix=job.prefix,
            compression=job.compression,
            rest=True,
            lengths=job.lengths_field is not None,
        )
        self.keys[split], self.seen[split] = [], set()
        return sink

    def finish(self, start: int) -> BlockRecord:
        """Close the shards, wait for their commits; the block's record."""
        shards = {split: tuple(sink.close()) for split, sink in self.sinks.items()}
        self.committer.wait()
        assert self.first is not None and self.last is not None  # a block has items
        return BlockRecord(
            block=self.block,
            start=start,
            stop=start + self.num_items,
            num_items=self.num_items,
            num_samples=self.num_items - self.skipped,
            skipped=self.skipped,
            nan_samples=self.nan_samples,
            nan_keys=tuple(self.nan_keys),
            fingerprint=self.job.fingerprint,
            first=self.first,
            last=block_end(self.last),
            splits=shards,
            rests={s: sink.rest for s, sink in self.sinks.items() if sink.rest is not None},
            keys={split: tuple(ks) for split, ks in self.keys.items()},
        )

    def discard(self) -> None:
        for sink in self.sinks.values():
            sink.discard()


def run_block(
    job: BlockJob,
    fs: Any,
    root: str,
    block: int,
    start: int,
    items: Iterable[tuple[int, Any]],
    *,
    abort: Any = None,
    report: Callable[[int, int], None] | None = None,
) -> BlockRecord:
    """Build one block from ``items`` (``(index, raw)`` in index order) and write its record.

    Returns the record (with the block's keys). On any error the block's temporary files and
    finished shards are removed.
    """
    tmpdir = None if is_local(fs) else tempfile.mkdtemp(prefix="build-shards-")
    committer = Committer()
    builder = _BlockBuilder(job, fs, root, block, tmpdir, committer)
    pending_items = pending_bytes = 0
    try:
        for index, raw in items:
            pending_bytes += builder.add(index, raw)
            pending_items += 1
            if pending_items >= CHECK_EVERY:
                if abort is not None and abort.is_set():
                    raise Aborted(f"block {block} stopped")
                if report is not None:
                    report(pending_items, pending_bytes)
                pending_items = pending_bytes = 0
        record = builder.finish(start)
        write_atomic(fs, record_path(root, block), record.to_json())
    except BaseException:
        committer.close()
        builder.discard()
        raise
    finally:
        committer.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if report is not None and (pending_items or pending_bytes):
        report(pending_items, pending_bytes)
    return record


def block_end(item: Item) -> BlockEnd:
    """The record's entry for a block's first or last item."""
    index, key, split, members = item
    return BlockEnd(index, key, sample_digest(key, split, members))
