"""``build-shards adopt --lengths FIELD``: each sample's length of a field, computed from the
shards and written beside them (:mod:`wdsloader.format.lengths`) with their checksum in the
manifest: for shards being adopted, and for a dataset that already has a manifest (built or
adopted) but no lengths. The shards and their indexes are not changed."""

from __future__ import annotations

import logging
import os
from typing import Any

from build_shards.adopt.scan import open_buffer
from build_shards.commit.card import refresh_card
from wdsloader.errors import ShardFormatError
from wdsloader.format import FieldSpec, Manifest, ShardInfo, decode_index, iter_samples
from wdsloader.format.codecs import require_codec
from wdsloader.format.deflate import inflate_sample
from wdsloader.format.lengths import (
    LENGTHS_FIELD,
    encode_lengths,
    lengths_path,
    lengths_sha256,
    sample_length,
)
from wdsloader.format.npy import read_npy_header
from wdsloader.io.manifest_io import load_manifest, save_manifest
from wdsloader.io.storage import join, url_to_fs, write_atomic

__all__ = ["add_lengths", "record_lengths"]

logger = logging.getLogger(__name__)


def _spec(manifest: Manifest, field: str, display: str) -> FieldSpec:
    spec = manifest.schema.get(field)
    if spec is None:
        raise ValueError(
            f"{display}: no field {field!r} to measure (--lengths); the fields are "
            f"{sorted(manifest.schema)}"
        )
    return spec


def _length(data: memoryview, spec: FieldSpec, field: str, key: str, where: str) -> int:
    """The length of one member's value: a ``.npy``'s first dimension from its header, else
    the decoded value's (:func:`~wdsloader.format.lengths.sample_length`)."""
    try:
        if spec.encoding == "npy":
            shape = read_npy_header(data)[1]
            if not shape:
                raise ValueError(f"sample {key!r}: lengths field {field!r} is a 0-d array")
            return int(shape[0])
        value = require_codec(spec.encoding, field).decode(data, spec)
        return sample_length(value, key=key, field=field)
    except ValueError as exc:
        raise ShardFormatError(f"{where}: {exc}") from None


def shard_lengths(buf: Any, offsets: Any, shard: ShardInfo, spec: FieldSpec, field: str,
                  where: str) -> list[int]:  # fmt: skip
    """Each sample's length of ``field`` in a shard's bytes ``buf`` (``offsets``: its index)."""
    view = memoryview(buf)
    out: list[int] = []
    try:
        for i in range(shard.num_samples):
            span: Any = view[int(offsets[i]) : int(offsets[i + 1])]
            if shard.compression is not None:
                span = memoryview(inflate_sample(span, f"{where}: sample #{i}"))
            for key, _, members in iter_samples(span, source=where):
                if spec.ext not in members:
                    raise ShardFormatError(
                        f"{where}: sample {key!r} has no member {spec.ext!r} (field {field!r}, "
                        f"the lengths field); it has {sorted(members)}"
                    )
                off, size = members[spec.ext]
                out.append(_length(span[off : off + size], spec, field, key, where))
            del span
    finally:
        view.release()
    if len(out) != shard.num_samples:
        raise ShardFormatError(
            f"{where}: {len(out)} samples found, the manifest says {shard.num_samples}"
        )
    return out


def record_lengths(fs: Any, base: str, display: str, manifest: Manifest, field: str) -> None:
    """Compute and write the lengths of ``field`` for every shard of ``manifest`` (a dataset
    at ``base`` on ``fs``, shown as ``display``); the manifest records them (not saved here)."""
    spec = _spec(manifest, field, display)
    for split in manifest.splits.values():
        for shard in split.shards:
            where = f"{display}/{shard.path}"
            offsets = decode_index(fs.cat_file(join(base, shard.idx_path)), source=where)
            with open_buffer(fs, join(base, shard.path)) as buf:
                lengths = shard_lengths(buf, offsets, shard, spec, field, where)
            data = encode_lengths(lengths)
            rel = lengths_path(shard.path)
            write_atomic(fs, join(base, rel), data)
            shard.lengths_path, shard.lengths_sha256 = rel, lengths_sha256(data)
    manifest.build[LENGTHS_FIELD] = field


def add_lengths(
    root: str | os.PathLike[str], field: str, *, storage_options: dict[str, Any] | None = None
) -> Manifest:
    """Add the lengths of ``field`` to the dataset at ``root`` (its ``manifest.json`` read,
    every shard measured, the manifest saved again, a card of ours brought up to date); returns
    the new manifest."""
    display = os.fspath(root).rstrip("/")
    fs, base = url_to_fs(root, storage_options)
    manifest = load_manifest(root, storage_options)
    record_lengths(fs, base, display, manifest, field)
    save_manifest(manifest, root, storage_options)
    refresh_card(fs, base, manifest)  # the card names the lengths' field
    logger.info("recorded the lengths of %r for %d samples under %s", field,
                manifest.num_samples, display)  # fmt: skip
    return manifest
