"""The end of a build's blocks: their remainders packed into full shards.

A block ends each split with a shard that is usually not full; when it is small (fewer than
``shard_max_count`` samples and under half of ``shard_max_bytes``) the block commits it under
``_build/rest/{split}/`` as its *remainder* (see :mod:`build_shards.write.sink`). Without packing, a
split that gets a small share of every block (``val`` at 10%) would be as many tiny shards as
there are blocks. Once every block is finished, :func:`pack_rests` reads each split's remainders
in block order and copies their samples' bytes (a gzip shard's inflated and compressed again, as
its writer does) into shards of the same sink, bounded by the same limits: each split then has
at most one such partial shard, its last. A packed shard's ``layout`` (the fields at a constant
offset) is what its remainders' layouts share.

The packing depends only on the block records (their remainders in block order), never on the
number of workers or the engine, so the shards stay byte-identical. A packed shard is named
after the remainder its first sample comes from (``{split}/{prefix}-BBBBB-PPP.tar``: block B,
part P, the name that remainder had), so the names are unique, and a split's shards sorted by
name are in the source order of their first samples. A split with a single remainder has it moved into place, not copied.

Packing runs in the process that drives the build; it copies at most one small shard per block
and split. A crash during it keeps every block (the remainders stay until the manifest is
written): a rerun packs again.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from build_shards.write.blocks import BlockJob
from build_shards.write.paths import shard_files, shard_name
from build_shards.write.records import BlockRecord
from build_shards.write.sink import Committer, ShardSink
from wdsloader.format import ShardInfo, decode_index, index_path, inflate_sample
from wdsloader.format.keyindex import keys_path
from wdsloader.format.lengths import lengths_path, read_lengths
from wdsloader.io.storage import is_local, join

Placed = tuple[tuple[int, int], ShardInfo]  # ((block, part), shard): where a shard sorts


class _PackSink(ShardSink):
    """A shard sink whose next shard is named after :attr:`place`, the (block, part) of the
    remainder its first sample comes from."""

    place: tuple[int, int] = (0, 0)
    places: list[tuple[int, int]]

    def next_name(self) -> str:
        self.places.append(self.place)
        return shard_name(*self.place, self.prefix, self.compression, split=self.split)


def pack_rests(
    records: Mapping[int, BlockRecord], job: BlockJob, fs: Any, root: str
) -> dict[str, list[Placed]]:
    """Pack the blocks' remainders of each split into full shards (see the module's text);
    ``{split: [((block, part), shard), ...]}`` of the shards written, in order."""
    by_split: dict[str, list[tuple[int, ShardInfo]]] = {}
    for b in sorted(records):
        for split, info in records[b].rests.items():
            by_split.setdefault(split, []).append((b, info))
    packed: dict[str, list[Placed]] = {}
    tmpdir = None if is_local(fs) else tempfile.mkdtemp(prefix="build-shards-")
    committer = Committer()
    sinks: list[ShardSink] = []
    try:
        for split, rests in by_split.items():
            if len(rests) == 1:
                b, info = rests[0]
                packed[split] = [
                    _move(fs, root, split, b, len(records[b].splits.get(split, ())), info)
                ]
                continue
            sink = _PackSink(
                fs, root, split, 0, max_count=job.shard_max_count,
                max_bytes=job.shard_max_bytes, tmpdir=tmpdir, committer=committer,
                prefix=job.prefix, compression=job.compression,
                lengths=job.lengths_field is not None,
            )  # fmt: skip
            sink.places = []
            sinks.append(sink)
            for b, info in rests:
                sink.place = (b, len(records[b].splits.get(split, ())))
                lengths = _lengths(fs, root, info)
                for i, sample in enumerate(_samples(fs, root, info, job.compression)):
                    sink.add_raw(
                        sample, info.layout, length=None if lengths is None else lengths[i]
                    )
            infos = sink.close()
            packed[split] = list(zip(sink.places, infos, strict=True))
        committer.wait()
    except BaseException:
        committer.close()
        for started in sinks:
            started.discard()
        raise
    finally:
        committer.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return packed


def _samples(fs: Any, root: str, info: ShardInfo, compression: str | None) -> Iterator[bytes]:
    """The tar bytes of every sample of a remainder, as its block's writer made them (its
    index gives where each starts; a gzip shard's samples are inflated one by one)."""
    path = join(root, info.path)
    data = fs.cat_file(path)
    offsets = decode_index(fs.cat_file(join(root, info.idx_path)), source=path).tolist()
    for i, (start, stop) in enumerate(itertools.pairwise(offsets)):
        span = data[start:stop]
        yield span if compression is None else inflate_sample(span, f"{path} sample {i}")


def _lengths(fs: Any, root: str, info: ShardInfo) -> list[int] | None:
    """A remainder's lengths (None when the build records none): they follow its samples."""
    if info.lengths_path is None:
        return None
    return [int(n) for n in read_lengths(fs, root, info).tolist()]


def _move(fs: Any, root: str, split: str, block: int, part: int, info: ShardInfo) -> Placed:
    """A split's only remainder, moved to its place among the shards (packing it alone would
    write the same bytes under the same name)."""
    rel = f"{split}/{os.path.basename(info.path)}"
    moved = dataclasses.replace(
        info,
        path=rel,
        idx_path=index_path(rel),
        keys_path=None if info.keys_path is None else keys_path(rel),
        lengths_path=None if info.lengths_path is None else lengths_path(rel),
    )
    # the shard last: its index and key index are in place once it is
    for src, dst in reversed(list(zip(shard_files(info), shard_files(moved), strict=True))):
        if is_local(fs):
            os.replace(join(root, src), join(root, dst))
        else:
            fs.mv(join(root, src), join(root, dst))
    return (block, part), moved
