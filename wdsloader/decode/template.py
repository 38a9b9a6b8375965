"""The one-pass check of a batch against a sample template: every member header of every
sample compared at once with the headers of a sample that passed every check before.

Samples of one shard layout written by one writer differ in few header bytes: the key in each
member's name, the size of each variable member, the checksums. A :class:`SampleTemplate` holds
the headers of one sample that the columnar decoder's full checks accepted (the member headers
of its gathered fields and those its walk found, together the whole sample); :meth:`~SampleTemplate.read`
then takes a batch in one gather of its headers (and of the blocks that hold the gathered
fields' ``.npy`` headers) and a few numpy passes: the bytes that may differ (keys, variable
sizes, checksums, array data) read out and blanked, and all the rest compared with the
template's in one ``memcmp``, so each header is equal to the template's outside the key, a
variable member's size and the checksum; one key per sample
in all its names; sound checksums; each member ending where the next header starts and the last
where the sample ends; the ``.npy`` headers of the gathered fields equal to the template's. It
accepts only what the full checks accept, and the values it gives (each field's bytes copied
once, from the read buffer into the batch array) are theirs; anything else returns None and
the batch takes the full checks, which also word the errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.decode.batch import RawBatch
from wdsloader.decode.gather import FieldTable, fixed_keys
from wdsloader.format.ustar import (
    BLOCK,
    CHECKSUM,
    SIZE,
    checksums_ok,
    header_sizes,
    octal_sizes,
    padded,
    plain_regular,
)

_DOT, _SLASH, _UNDERSCORE = ord("."), ord("/"), ord("_")
_NOT_IN_KEY = np.zeros(256, dtype=bool)
_NOT_IN_KEY[[_DOT, _SLASH, 0]] = True
CHUNK = 32
"""Samples whose blocks one ``memcmp`` compares with the template's (the template keeps its
blocks repeated this many times)."""


@dataclass(frozen=True, slots=True)
class _Field:
    """A gathered field of the template: its data at ``at`` from the sample's start, past a
    ``.npy`` header equal to ``npy`` (empty for a raw field), ``count`` bytes."""

    name: str
    table: FieldTable
    at: int
    npy: np.ndarray
    count: int


@dataclass(frozen=True, slots=True)
class Read:
    """What :meth:`SampleTemplate.read` gives a batch: its keys, its gathered fields' values
    and where the walked members lie (``{ext: (data positions, sizes)}``)."""

    keys: list[str]
    gathered: dict[str, Any]
    found: dict[str, tuple[np.ndarray, np.ndarray]]


class SampleTemplate:
    """The member headers of one sample (``headers``: ``(k, 512)`` at ``rel`` from its start,
    ``rel[0] == 0``, each member ending where the next header starts), its key ``key_len``
    bytes long; ``variable[i]``: member ``i``'s size may differ between samples (a walked
    member; ``walked`` maps its extension to ``i``); ``fields``: the gathered fields."""

    __slots__ = (
        "base_sum",
        "blocks",
        "const",
        "fields",
        "key_len",
        "last_block",
        "npy_lens",
        "rel",
        "sizes",
        "tiled",
        "varying",
        "walked",
    )

    def __init__(
        self,
        headers: np.ndarray,
        rel: np.ndarray,
        key_len: int,
        variable: np.ndarray,
        walked: Mapping[str, int],
        fields: Sequence[_Field],
    ) -> None:
        self.rel = rel
        self.key_len = key_len
        self.varying = np.flatnonzero(variable)
        self.walked = dict(walked)
        self.fields = tuple(fields)
        sizes = header_sizes(headers)
        assert sizes is not None
        self.sizes = sizes
        # the blocks compared: the member headers, then those that start with a gathered
        # field's .npy header (only the header's bytes compared)
        npy = [f for f in self.fields if len(f.npy)]
        self.blocks = np.concatenate([rel >> 9, [f.at >> 9 for f in npy]]).astype(np.int64)
        self.last_block = int(self.blocks.max())
        self.npy_lens = tuple(len(f.npy) for f in npy)
        const = np.zeros((len(self.blocks), BLOCK), dtype=np.uint8)
        const[: len(rel)] = headers
        const[: len(rel), :key_len] = 0
        const[: len(rel), CHECKSUM] = 0
        const[self.varying, SIZE] = 0
        for i, f in enumerate(npy):
            const[len(rel) + i, : len(f.npy)] = f.npy
        self.const = const
        # each header's checksum less its key and variable size bytes (the checksum field
        # counted as spaces): the rest of its bytes are the template's
        self.base_sum = const[: len(rel)].sum(axis=1, dtype=np.int64) + 8 * ord(" ")
        self.tiled = np.tile(const, (CHUNK, 1)).tobytes()

    def read(self, buf: np.ndarray, start: np.ndarray, stop: np.ndarray) -> Read | None:
        """The batch of samples ``buf[start[j]:stop[j]]`` read by the template, or None when a
        sample differs from it in anything but its key, variable sizes and checksums."""
        n = len(start)
        if not n or (start & (BLOCK - 1)).any() or start.min() < 0:
            return None
        if int(stop.max()) > len(buf) or not buf.flags.c_contiguous:
            return None
        blocks = buf[: len(buf) // BLOCK * BLOCK].reshape(-1, BLOCK)
        if (int(start.max()) >> 9) + int(self.last_block) >= len(blocks):
            return None
        # one gather of every header and .npy header block, (n, k + npy, 512), into bytes
        # that compare with the template's in one memcmp
        scratch = bytearray(n * len(self.blocks) * BLOCK)
        got = np.frombuffer(scratch, dtype=np.uint8).reshape(n, len(self.blocks), BLOCK)
        index = ((start >> 9)[:, None] + self.blocks).ravel()
        # every index is in range (checked above): "clip" writes into ``got`` directly, where
        # the default mode would gather into a temporary and copy it over (2.5x the CPU)
        np.take(blocks, index, axis=0, out=got.reshape(-1, BLOCK), mode="clip")
        k, key_len = len(self.rel), self.key_len
        headers = got[:, :k]
        keys = headers[:, 0, :key_len].copy()
        if not _plain_keys(keys):
            return None
        fields = headers[:, :, CHECKSUM].copy()
        varying = headers[:, self.varying, SIZE].copy()
        # the bytes that may differ blanked (each name's key XORed with its sample's key: zero
        # where they are equal), the rest compared with the template's at once
        headers[:, :, :key_len] ^= keys[:, None]
        headers[:, :, CHECKSUM] = 0
        for i in self.varying.tolist():
            headers[:, i, SIZE] = 0
        for i, length in enumerate(self.npy_lens):
            got[:, k + i, length:] = 0
        if not self._matches(scratch):
            return None
        sums = self.base_sum + keys.sum(axis=1, dtype=np.int64)[:, None]
        sizes = np.broadcast_to(self.sizes, (n, k))
        if len(self.varying):
            found = octal_sizes(varying.reshape(-1, SIZE.stop - SIZE.start))
            if found is None:
                return None
            sizes = sizes.copy()
            sizes[:, self.varying] = found.reshape(n, -1)
            sums[:, self.varying] += varying.sum(axis=2, dtype=np.int64)
        if not _checksums_are(fields, sums):
            return None
        ends = self.rel + BLOCK + (sizes + (BLOCK - 1)) // BLOCK * BLOCK
        if not (ends[:, :-1] == self.rel[1:]).all() or not (ends[:, -1] == stop - start).all():
            return None
        gathered = {field.name: _values(buf, start, field) for field in self.fields}
        found_at = {
            ext: (start + int(self.rel[i] + BLOCK), np.ascontiguousarray(sizes[:, i]))
            for ext, i in self.walked.items()
        }
        return Read(fixed_keys(keys), gathered, found_at)

    def _matches(self, got: bytearray) -> bool:
        """Whether ``got`` (blocks of samples, blanked as :meth:`read` does) holds the
        template's blocks for every sample: ``memcmp`` of :data:`CHUNK` samples at a time."""
        tiled = self.tiled
        at, size = 0, len(got)
        while at + len(tiled) <= size:
            if not got.startswith(tiled, at):
                return False
            at += len(tiled)
        return at == size or got.startswith(memoryview(tiled)[: size - at], at)


_SHIFTS = np.array([15, 12, 9, 6, 3, 0], dtype=np.int64)


def _checksums_are(fields: np.ndarray, sums: np.ndarray) -> bool:
    """Whether every checksum field (``(n, k, 8)``) holds its header's byte sum ``sums`` in
    the usual form (six octal digits and a NUL), as
    :func:`wdsloader.format.ustar.checksums_ok` reads it; False may also be another form."""
    digits = ((sums[:, :, None] >> _SHIFTS) & 7) + ord("0")
    return bool((fields[:, :, :6] == digits).all() and (fields[:, :, 6] == 0).all())


def _plain_keys(keys: np.ndarray) -> bool:
    """Whether each key (``(n, key_len)`` bytes) reads as the row parser reads it: no dot,
    slash or NUL inside, not led by ``__`` (a metadata name is the parser's to skip)."""
    if _NOT_IN_KEY[keys].any():
        return False
    return not (
        keys.shape[1] >= 2 and ((keys[:, 0] == _UNDERSCORE) & (keys[:, 1] == _UNDERSCORE)).any()
    )


def _values(buf: np.ndarray, start: np.ndarray, field: _Field) -> Any:
    """Field ``field`` of the samples at ``start`` (multiples of 512 whose samples the
    template checked, ``.npy`` headers included): its bytes copied once into the batch array
    (``bytes`` for an undeclared bytes field)."""
    at = field.at + len(field.npy)
    table = field.table
    if table.as_bytes:
        view = memoryview(buf)  # type: ignore[arg-type]
        return [bytes(view[p : p + field.count]) for p in (start + at).tolist()]
    # row r of ``rows``: the field's bytes of a sample starting at byte 512 r
    rows = np.ndarray(
        ((len(buf) - at - field.count) // BLOCK + 1, field.count),
        dtype=np.uint8,
        buffer=buf,
        offset=at,
        strides=(BLOCK, 1),
    )
    return rows[start >> 9].view(table.dtype).reshape(len(start), *table.shape)


def learn(
    buf: np.ndarray,
    start: int,
    stop: int,
    key_len: int,
    tables: Mapping[str, FieldTable],
    shard: int,
    walked: Mapping[str, tuple[int, int]],
) -> SampleTemplate | None:
    """The template of the sample ``buf[start:stop]`` (one that passed every check of the
    columnar decoder) of shard ``shard``: the member headers of its gathered fields ``tables``
    (at their layout's offsets) and of the members a walk found, ``walked``
    (``{ext: (data offset from the sample's start, size)}``); None unless these members are
    the whole sample, in plain headers at multiples of 512 bytes, and each gathered field's
    ``.npy`` header is the schema's."""
    members: dict[int, tuple[str | None, int, bool]] = {}  # header offset -> (ext, size, walked)
    fields: list[_Field] = []
    for name, table in tables.items():
        at = int(table.offsets[shard])
        members[at - BLOCK] = (None, table.nbytes, False)
        span = table.data_span(buf[start + at : start + at + table.nbytes])
        if span is None:
            return None
        skip, count = span
        if skip > BLOCK or at & (BLOCK - 1):
            return None
        npy = buf[start + at : start + at + skip].copy()
        fields.append(_Field(name, table, at, npy, count))
    for ext, (at, size) in walked.items():
        if at - BLOCK in members:
            return None
        members[at - BLOCK] = (ext, size, True)
    rel = np.array(sorted(members), dtype=np.int64)
    if not len(rel) or rel[0] != 0 or (rel & (BLOCK - 1)).any():
        return None
    sizes = np.array([members[r][1] for r in rel.tolist()], dtype=np.int64)
    ends = rel + BLOCK + np.array([padded(int(s)) for s in sizes], dtype=np.int64)
    if not (ends[:-1] == rel[1:]).all() or int(ends[-1]) != stop - start:
        return None
    if start + int(rel[-1]) + BLOCK > len(buf):
        return None
    headers = np.stack([buf[start + r : start + r + BLOCK] for r in rel.tolist()])
    if not plain_regular(headers) or not checksums_ok(headers).all():
        return None
    if header_sizes(headers) is None:  # size fields in a form the template does not compare
        return None
    variable = np.array([members[r][2] for r in rel.tolist()], dtype=bool)
    index = {e: i for i, r in enumerate(rel.tolist()) if (e := members[r][0]) is not None}
    return SampleTemplate(headers, rel, key_len, variable, index, fields)


MAX_TEMPLATES = 64


class Templates:
    """The templates of a columnar decoder's batches, one per (layout of the gathered fields,
    start of the walk): ``tables`` the gathered fields, ``layout_id[s]`` and ``walk_from[s]``
    those of shard ``s``."""

    def __init__(
        self, tables: Mapping[str, FieldTable], layout_id: np.ndarray, walk_from: np.ndarray
    ) -> None:
        self.tables = dict(tables)
        self.layout_id = layout_id
        self.walk_from = walk_from
        self.known: dict[tuple[int, int], SampleTemplate | None] = {}

    def _key(self, raw: RawBatch) -> tuple[int, int] | None:
        ids, starts = self.layout_id[raw.shard], self.walk_from[raw.shard]
        if not len(ids) or ids[0] < 0 or (ids != ids[0]).any() or (starts != starts[0]).any():
            return None
        return int(ids[0]), int(starts[0])

    def read(self, raw: RawBatch) -> Read | None:
        """The batch read by the template of its layout, when it has one and every sample
        matches it (else None: the full checks)."""
        if not self.known or raw.buf is None or raw.placed:
            return None
        key = self._key(raw)
        template = None if key is None else self.known.get(key)
        return None if template is None else template.read(raw.buf, raw.start, raw.stop)

    def learn(
        self, raw: RawBatch, found: Mapping[str, tuple[np.ndarray, np.ndarray]], ends: np.ndarray
    ) -> None:
        """Learn the template of the batch's layout from its first sample: the batch passed
        every check, its walk found ``found``, its keys end at ``ends``. Once per layout (a
        layout whose first batch gives no template gets none)."""
        key = self._key(raw)
        if key is None or key in self.known or len(self.known) >= MAX_TEMPLATES:
            return
        if raw.buf is None or raw.placed or not len(ends) or (ends != ends[0]).any():
            return
        start, stop = int(raw.start[0]), int(raw.stop[0])
        gathered = {table.ext for table in self.tables.values()}
        walked = {
            ext: (int(pos[0]) - start, int(size[0]))
            for ext, (pos, size) in found.items()
            if ext not in gathered
        }
        template = learn(raw.buf, start, stop, int(ends[0]), self.tables, int(raw.shard[0]), walked)
        if template is not None and template.read(raw.buf, raw.start, raw.stop) is None:
            template = None  # its own batch differs from it (mtimes that vary...)
        self.known[key] = template
