"""Where a block's samples become shards: :class:`ShardSink` rolls the shards of one (block,
split) over at the count and byte bounds; :class:`Committer` makes finished shards durable and
visible on a background thread while the next one is encoded.

A shard is written under a temporary name (local: in its own folder; remote: in a local temp
folder) and becomes visible complete: ``os.replace`` locally, one ``put_file`` on object stores,
then its index.

A block's last shard of a split that is small (fewer than ``max_count`` samples and under half
of ``max_bytes``) is its *remainder*: with ``rest=True`` it is committed under
``_build/rest/{split}/`` instead, and :mod:`build_shards.write.rests` packs the remainders of all
blocks into full shards at the end of the build.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from build_shards.write.paths import BUILD_DIR, SHARD_PREFIXES, TMP_MARK, remove_quietly, shard_name
from wdsloader.format import ShardInfo, TarStreamWriter, index_path
from wdsloader.format.keyindex import keys_path
from wdsloader.format.lengths import encode_lengths, lengths_path, lengths_sha256
from wdsloader.io.storage import is_local, join, write_atomic

log = logging.getLogger("build_shards")

MAX_UNCOMMITTED = 2  # finished shards waiting for fsync + rename (or upload: local temp space)
REST_DIR = f"{BUILD_DIR}/rest"  # where blocks commit their remainders (relative to the root)


class Committer:
    """Makes finished shards durable and visible on one background thread (fsync, close, rename
    or upload, index), so the next shard is encoded while the disk catches up.

    At most ``MAX_UNCOMMITTED`` shards wait; :meth:`submit` blocks on the oldest beyond that.
    A failed commit raises in the thread that calls :meth:`submit` or :meth:`wait`.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[None]] = deque()

    def submit(self, commit: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="build-shards-commit")
        while len(self._pending) >= MAX_UNCOMMITTED:
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
        prefix: str = SHARD_PREFIXES[0],
        compression: str | None = None,
        rest: bool = False,
        lengths: bool = False,
    ) -> None:
        self.fs, self.root, self.split, self.block = fs, root, split, block
        self.keep_rest = rest
        self.lengths = lengths  # record each sample's length (given to add/add_raw) beside it
        self._lengths: list[int] = []  # of the open shard's samples
        self.rest: ShardInfo | None = None  # the remainder (see the module's text), if any
        self._name = ""  # of the open shard
        self.prefix = prefix
        self.compression = compression
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
            if rest:
                fs.makedirs(join(root, REST_DIR, split), exist_ok=True)

    def add(self, key: str, members: list[tuple[str, bytes]], *, length: int | None = None) -> int:
        """Write one sample (``length``: its length, when the sink records lengths); returns
        the bytes it added."""
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
        self._record(length)
        return w.offset - before

    def _record(self, length: int | None) -> None:
        if self.lengths:
            assert length is not None, "a sink that records lengths is given each sample's"
            self._lengths.append(length)

    def add_raw(
        self, sample: bytes, layout: dict[str, list[int]] | None, *, length: int | None = None
    ) -> None:
        """Write one sample's tar bytes as another shard holds them (its ``layout``), under the
        same bounds as :meth:`add`."""
        w = self._writer
        if w is not None and (
            w.num_samples >= self.max_count or w.projected_raw_size(len(sample)) > self.max_bytes
        ):
            self._finish()
            w = None
        if w is None:
            w = self._open()
        w.write_raw(sample, layout)
        self._record(length)

    def next_name(self) -> str:
        """The file name of the next shard this sink opens."""
        return shard_name(
            self.block, len(self.infos), self.prefix, self.compression, split=self.split
        )

    def _open(self) -> TarStreamWriter:
        name = self._name = self.next_name()
        if self.local:
            self._tmp = join(self.root, self.split, f"{name}{TMP_MARK}{uuid.uuid4().hex[:12]}")
        else:
            assert self.tmpdir is not None
            self._tmp = os.path.join(self.tmpdir, f"{self.split}-{name}")
        self._file = open(self._tmp, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in _commit)
        self._writer = TarStreamWriter(self._file, compression=self.compression)
        self._lengths = []
        return self._writer

    def _finish(self, *, rest: bool = False) -> None:
        """Close the open shard, record its info (``rest``: as the remainder), and commit it
        (in the background when there is a committer)."""
        w, f, tmp = self._writer, self._file, self._tmp
        assert w is not None and f is not None and tmp is not None
        idx, sha = w.close()
        f.flush()
        self._writer = self._file = self._tmp = None
        rel = f"{REST_DIR}/{self.split}/{self._name}" if rest else f"{self.split}/{self._name}"
        lengths = encode_lengths(self._lengths) if self.lengths else None
        info = ShardInfo(
            path=rel,
            idx_path=index_path(rel),
            keys_path=keys_path(rel),
            lengths_path=lengths_path(rel) if self.lengths else None,
            lengths_sha256=None if lengths is None else lengths_sha256(lengths),
            num_samples=w.num_samples,
            num_bytes=w.offset,
            sha256=sha,
            layout=w.layout,
            compression=self.compression,
        )
        if rest:
            self.rest = info
        else:
            self.infos.append(info)
        side = [(index_path(rel), idx), (keys_path(rel), w.key_index())]
        if info.lengths_path is not None and lengths is not None:
            side.append((info.lengths_path, lengths))
        if self.committer is None:
            self._commit(f, tmp, rel, side)
            return
        try:
            self.committer.submit(lambda: self._commit(f, tmp, rel, side))
        except BaseException:  # an earlier commit failed: this one was not submitted
            f.close()
            remove_quietly(tmp)
            raise

    def _commit(self, f: BinaryIO, tmp: str, rel: str, side: list[tuple[str, bytes]]) -> None:
        """Make a finished shard durable and visible under its final name, then its ``side``
        files (index, key index, lengths: ``(path, bytes)`` relative to the root)."""
        final = join(self.root, rel)
        try:
            if self.local:
                os.fsync(f.fileno())
            f.close()
            if self.local:
                os.makedirs(os.path.dirname(final), exist_ok=True)
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
        for path, data in side:
            write_atomic(self.fs, join(self.root, path), data)
            self.written.append(join(self.root, path))

    def close(self) -> list[ShardInfo]:
        """Finish the open shard (as the remainder when it is small and ``rest`` was asked
        for: see :attr:`rest`); the full shards written, in order (committed once the
        committer is waited for)."""
        w = self._writer
        if w is not None:
            small = w.num_samples < self.max_count and 2 * w.offset < self.max_bytes
            self._finish(rest=self.keep_rest and small)
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
