"""The worker side of a build: turn one block of source items into finished shards.

A block is a run of consecutive source indices. Each block writes its own shards per split,
``{split}/shard-BBBBB-PPP.tar`` (B the block, P the part within the block) plus the ``.tar.idx``
beside each, bounded by ``shard_max_count`` samples and ``shard_max_bytes`` real file bytes. A
shard is written under a temporary name (local: in its own folder; remote: in a local temp folder)
and becomes visible complete: ``os.replace`` locally, one ``put_file`` on object stores. That
commit (fsync, rename or upload, index) runs on a background thread while the next shard is
encoded. When all of a block's shards are committed, its record ``_build/block-BBBBB.json`` is
written atomically: that record is what makes a rerun skip the block. It also holds a digest of
the block's first and last items (key, split and encoded members), which a rerun compares with
its own source before it keeps the block.

A build that replaces a complete dataset writes its shards beside the old ones under the other
name prefix (``shard-r-BBBBB-PPP.tar``), so the old dataset stays readable until the new
manifest replaces the old one.

Blocks the parent reads (in-memory and sequential sources) reach worker processes as
:class:`SpooledItems`: their array fields go through a file the worker maps, not through pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import tempfile
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from build_shards.encode import SampleEncoder
from build_shards.errors import BuildError, SampleKeyError
from build_shards.splits import Splitter
from wdsloader.format import ShardInfo, TarStreamWriter, index_path, validate_key
from wdsloader.io.storage import is_local, join, write_atomic

log = logging.getLogger("build_shards")

BUILD_DIR = "_build"
TMP_MARK = ".tmp-"
_CHECK_EVERY = 64  # items between checks of the abort flag and progress reports
_MAX_UNCOMMITTED = 2  # finished shards waiting for fsync + rename (or upload: local temp space)


SHARD_PREFIXES = ("shard", "shard-r")  # a replacing build takes the one the old dataset lacks


def shard_name(block: int, part: int, prefix: str = "shard") -> str:
    """File name of part ``part`` of block ``block``."""
    return f"{prefix}-{block:05d}-{part:03d}.tar"


def record_path(root: str, block: int) -> str:
    """Path of a finished block's record."""
    return join(root, BUILD_DIR, f"block-{block:05d}.json")


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
    prefix: str = "shard"  # of the shard file names (see SHARD_PREFIXES)


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


class Committer:
    """Makes finished shards durable and visible on one background thread (fsync, close, rename
    or upload, index), so the next shard is encoded while the disk catches up.

    At most ``_MAX_UNCOMMITTED`` shards wait; :meth:`submit` blocks on the oldest beyond that.
    A failed commit raises in the thread that calls :meth:`submit` or :meth:`wait`.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[None]] = deque()

    def submit(self, commit: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="build-shards-commit")
        while len(self._pending) >= _MAX_UNCOMMITTED:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(commit))

    def wait(self, *, raise_errors: bool = True) -> None:
        """Block until every submitted commit is done; re-raise the first failure."""
        first: BaseException | None = None
        while self._pending:
            exc = self._pending.popleft().exception()
            first = first or exc
        if first is not None and raise_errors:
            raise first

    def close(self) -> None:
        """Wait for the commits (errors ignored: :meth:`wait` reports them) and end the thread."""
        self.wait(raise_errors=False)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class ShardSink:
    """The shards of one (block, split): rolls over at the count and byte bounds."""

    def __init__(
        self,
        fs: Any,
        root: str,
        split: str,
        block: int,
        *,
        max_count: int,
        max_bytes: int,
        tmpdir: str | None,
        committer: Committer | None = None,
        prefix: str = "shard",
    ) -> None:
        self.fs, self.root, self.split, self.block = fs, root, split, block
        self.prefix = prefix
        self.max_count, self.max_bytes = max_count, max_bytes
        self.local = is_local(fs)
        self.tmpdir = tmpdir
        self.committer = committer
        self.infos: list[ShardInfo] = []
        self.written: list[str] = []
        self._file: BinaryIO | None = None
        self._tmp: str | None = None
        self._writer: TarStreamWriter | None = None
        if self.local:
            os.makedirs(join(root, split), exist_ok=True)
        else:
            fs.makedirs(join(root, split), exist_ok=True)  # a no-op on object stores

    def add(self, key: str, members: list[tuple[str, bytes]]) -> int:
        """Write one sample; returns the bytes it added."""
        w = self._writer
        if w is not None and (
            w.num_samples >= self.max_count or w.projected_size(members) > self.max_bytes
        ):
            self._finish()
            w = None
        if w is None:
            w = self._open()
            size = w.projected_size(members)
            if size > self.max_bytes:
                log.warning(
                    "sample %r alone makes a %d-byte shard, over shard_max_bytes=%d: it gets a "
                    "shard of its own",
                    key,
                    size,
                    self.max_bytes,
                )
        before = w.offset
        w.write_sample(key, members)
        return w.offset - before

    def _open(self) -> TarStreamWriter:
        name = shard_name(self.block, len(self.infos), self.prefix)
        if self.local:
            self._tmp = join(self.root, self.split, f"{name}{TMP_MARK}{uuid.uuid4().hex[:12]}")
        else:
            assert self.tmpdir is not None
            self._tmp = os.path.join(self.tmpdir, f"{self.split}-{name}")
        self._file = open(self._tmp, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in _commit)
        self._writer = TarStreamWriter(self._file)
        return self._writer

    def _finish(self) -> None:
        """Close the open shard, record its info, and commit it (in the background when there
        is a committer)."""
        w, f, tmp = self._writer, self._file, self._tmp
        assert w is not None and f is not None and tmp is not None
        idx, sha = w.close()
        f.flush()
        self._writer = self._file = self._tmp = None
        rel = f"{self.split}/{shard_name(self.block, len(self.infos), self.prefix)}"
        self.infos.append(
            ShardInfo(
                path=rel,
                idx_path=index_path(rel),
                num_samples=w.num_samples,
                num_bytes=w.offset,
                sha256=sha,
                layout=w.layout,
            )
        )
        if self.committer is None:
            self._commit(f, tmp, rel, idx)
            return
        try:
            self.committer.submit(lambda: self._commit(f, tmp, rel, idx))
        except BaseException:  # an earlier commit failed: this one was not submitted
            f.close()
            _remove_quietly(tmp)
            raise

    def _commit(self, f: BinaryIO, tmp: str, rel: str, idx: bytes) -> None:
        """Make a finished shard durable and visible under its final name, then its index."""
        final = join(self.root, rel)
        try:
            if self.local:
                os.fsync(f.fileno())
            f.close()
            if self.local:
                os.replace(tmp, final)
            else:
                self.fs.put_file(tmp, final)
                os.remove(tmp)
        except BaseException:
            f.close()
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        self.written.append(final)
        write_atomic(self.fs, join(self.root, index_path(rel)), idx)
        self.written.append(join(self.root, index_path(rel)))

    def close(self) -> list[ShardInfo]:
        """Finish the open shard; the shards written, in order (committed once the committer
        is waited for)."""
        if self._writer is not None:
            self._finish()
        return self.infos

    def discard(self) -> None:
        """Remove the temporary file and every shard this sink made visible (close the
        committer first, so that no commit is under way)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None and os.path.exists(self._tmp):
            os.remove(self._tmp)
        for path in self.written:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass
        self.written.clear()


class Aborted(Exception):
    """Raised in a worker when the build was stopped by another worker's error."""


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
) -> dict[str, Any]:
    """Build one block from ``items`` (``(index, raw)`` in index order) and write its record.

    Returns the record: the block's shards per split (in order of first appearance), its keys per
    split (for the duplicate check across blocks), its counts and the digests of its first and
    last items. On any error the block's temporary files and finished shards are removed.
    """
    sinks: dict[str, ShardSink] = {}
    keys: dict[str, list[str]] = {}
    seen: dict[str, set[str]] = {}
    tmpdir = None if is_local(fs) else tempfile.mkdtemp(prefix="build-shards-")
    committer = Committer()
    num_items = skipped = nan_samples = 0
    nan_keys: list[str] = []
    pending_items = pending_bytes = 0
    first: dict[str, Any] | None = None
    last: tuple[int, str | None, str | None, list[tuple[str, bytes]]] | None = None
    try:
        for index, raw in items:
            num_items += 1
            prepared = prepare(job, index, raw)
            if prepared is None:
                skipped += 1
                last = (index, None, None, [])
            else:
                key, split, sample = prepared
                members, nonfinite = job.encoder.encode(key, sample)
                sink = sinks.get(split)
                if sink is None:
                    sink = sinks[split] = ShardSink(
                        fs,
                        root,
                        split,
                        block,
                        max_count=job.shard_max_count,
                        max_bytes=job.shard_max_bytes,
                        tmpdir=tmpdir,
                        committer=committer,
                        prefix=job.prefix,
                    )
                    keys[split], seen[split] = [], set()
                if key in seen[split]:
                    raise BuildError(f"duplicate key {key!r} in split {split!r}")
                seen[split].add(key)
                keys[split].append(key)
                pending_bytes += sink.add(key, members)
                last = (index, key, split, members)
                if nonfinite:
                    nan_samples += 1
                    if len(nan_keys) < 5:
                        nan_keys.append(key)
            if first is None:
                first = _ends_entry(last)
            pending_items += 1
            if pending_items >= _CHECK_EVERY:
                if abort is not None and abort.is_set():
                    raise Aborted(f"block {block} stopped")
                if report is not None:
                    report(pending_items, pending_bytes)
                pending_items = pending_bytes = 0
        shards = {split: [_info_dict(i) for i in sink.close()] for split, sink in sinks.items()}
        committer.wait()
        record = {
            "block": block,
            "start": start,
            "stop": start + num_items,
            "num_items": num_items,
            "num_samples": num_items - skipped,
            "skipped": skipped,
            "nan_samples": nan_samples,
            "nan_keys": nan_keys,
            "fingerprint": job.fingerprint,
            "first": first,
            "last": _ends_entry(last) if last is not None else None,
            "splits": shards,
            "keys": keys,
        }
        write_atomic(fs, record_path(root, block), json.dumps(record).encode())
    except BaseException:
        committer.close()
        for sink in sinks.values():
            sink.discard()
        raise
    finally:
        committer.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if report is not None and (pending_items or pending_bytes):
        report(pending_items, pending_bytes)
    return record


def _ends_entry(
    item: tuple[int, str | None, str | None, list[tuple[str, bytes]]],
) -> dict[str, Any]:
    """The record's entry for a block's first or last item."""
    index, key, split, members = item
    return {"index": index, "key": key, "digest": sample_digest(key, split, members)}


def _info_dict(info: ShardInfo) -> dict[str, Any]:
    return {
        "path": info.path,
        "idx_path": info.idx_path,
        "num_samples": info.num_samples,
        "num_bytes": info.num_bytes,
        "sha256": info.sha256,
        "layout": info.layout,
    }


# ------------------------------------------------------------------------------------------------
# Worker processes
# ------------------------------------------------------------------------------------------------

_SPOOL_ALIGN = 64  # byte alignment of each array column in a spool file


@dataclass(frozen=True, slots=True)
class _Column:
    """Where one stacked array field lies in a spool file."""

    offset: int
    dtype: np.dtype[Any]  # the dtype itself: it pickles exactly (byte order, record fields)
    shape: tuple[int, ...]


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class SpooledItems:
    """A block of items the parent read (in-memory or sequential source), for a worker process.

    Pickling dicts of many small numpy arrays through the pool's pipe cost more than building
    their shards (each array is reduced, copied several times into fresh memory and rebuilt). So
    when every item of the block is a dict with the same names in the same order, each field
    whose values are all plain numpy arrays of one dtype and shape is written, one value after
    the other, to a temporary file; the worker maps that file (copy-on-write) and gets the
    values back as rows of one array per field. Other fields travel pickled, as lists.

    Iterating gives ``(index, dict)`` pairs equal to the original items. The worker removes the
    file as soon as it has mapped it; the object the parent made removes it when it is
    garbage-collected (after the worker ran the block, or when the block was cancelled).
    """

    def __init__(
        self,
        indices: list[int],
        names: tuple[str, ...],
        arrays: dict[str, _Column],
        others: dict[str, list[Any]],
        path: str,
    ) -> None:
        self.indices, self.names, self.path = indices, names, path
        self.arrays, self.others = arrays, others
        self._cleanup = weakref.finalize(self, _remove_quietly, path)

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("indices", "names", "arrays", "others", "path")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # no cleanup here: the worker removes the file once mapped

    def __len__(self) -> int:
        return len(self.indices)

    def _map(self) -> dict[str, np.ndarray]:
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        _remove_quietly(self.path)  # the mapping keeps the data
        n = len(self.indices)
        stacked = {}
        for name, col in self.arrays.items():
            flat = np.frombuffer(mapped, col.dtype, n * math.prod(col.shape), col.offset)
            stacked[name] = flat.reshape(n, *col.shape)
        return stacked

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        stacked = self._map()
        names = self.names
        columns = [stacked[n] if n in stacked else self.others[n] for n in names]
        for j, index in enumerate(self.indices):
            yield index, dict(zip(names, [col[j] for col in columns], strict=True))


def _is_column(values: list[Any]) -> bool:
    """True when ``values`` are plain numpy arrays (not 0-d, not object) of one dtype and shape,
    with data."""
    first = values[0]
    if type(first) is not np.ndarray or first.dtype.hasobject or first.ndim == 0:
        return False
    dtype, shape = first.dtype, first.shape
    return first.nbytes > 0 and all(
        type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in values
    )


def _write_columns(f: BinaryIO, columns: dict[str, list[np.ndarray]]) -> dict[str, _Column]:
    offset = 0
    placed: dict[str, _Column] = {}
    for name, values in columns.items():
        pad = -offset % _SPOOL_ALIGN
        f.write(bytes(pad))
        offset += pad
        first = values[0]
        placed[name] = _Column(offset, first.dtype, first.shape)
        for v in values:
            f.write(v if v.flags.c_contiguous else np.ascontiguousarray(v))
        offset += first.nbytes * len(values)
    return placed


def spool_items(
    items: Iterable[tuple[int, Any]], fs: Any = None, root: str | None = None
) -> list[tuple[int, Any]] | SpooledItems:
    """A block of items the parent read, made ready to send to a worker process: a
    :class:`SpooledItems` when its items are dicts of one set of names with array fields, else
    the ``(index, item)`` list.

    The spool file goes under the output's ``_build/`` when the output (``fs``, ``root``) is
    local, so whatever a killed build leaves there goes with the rest of its state; else in the
    system's temporary folder.
    """
    pairs = list(items)
    raws = [raw for _, raw in pairs]
    if not raws or any(type(raw) is not dict for raw in raws):
        return pairs
    names = tuple(raws[0])
    if any(len(raw) != len(names) or tuple(raw) != names for raw in raws):
        return pairs
    by_name = {name: [raw[name] for raw in raws] for name in names}
    arrays = {name: values for name, values in by_name.items() if _is_column(values)}
    if not arrays:
        return pairs
    folder = None
    if fs is not None and root is not None and is_local(fs):
        folder = join(root, BUILD_DIR)
        os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="spool-", dir=folder)
    try:
        with open(fd, "wb", buffering=1 << 20) as f:
            placed = _write_columns(f, arrays)
    except BaseException:
        _remove_quietly(path)
        raise
    others = {name: values for name, values in by_name.items() if name not in arrays}
    return SpooledItems([index for index, _ in pairs], names, placed, others, path)
