"""The columnar decoder: a whole batch decoded as columns, fixed-size fields gathered for all
samples at once (:mod:`wdsloader.decode.gather`).

:meth:`ColumnarDecoder.decode` returns the batch's :class:`Columns`, or a :class:`NotGatherable`
saying why the batch's bytes do not fit the shards' layout (a header that is not plain ustar,
``.npy`` headers that differ, a sample that does not parse...): only such a batch goes to the
row decoder, which also words the format errors. A decoder that raises is an error of its
sample (:attr:`Columns.errors`), worded as the row decoder words it, never a reason to re-read
the batch another way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsloader.decode.batch import Columns, NotGatherable, RawBatch
from wdsloader.decode.codecs import decode_bytes, decode_uint8
from wdsloader.decode.finder import MemberFinder
from wdsloader.decode.gather import (
    FieldTable,
    field_tables,
    gather_rows,
    key_ends,
    key_strings,
    named_members,
    prefix_end,
    walk_start,
)
from wdsloader.decode.images import is_image_decoder
from wdsloader.decode.layouts import block_plan, by_rows, layout_groups
from wdsloader.decode.parse import parse_sample
from wdsloader.decode.placement import Placement, placed_values, restore
from wdsloader.decode.registry import SampleDecoder
from wdsloader.decode.template import Read, Templates
from wdsloader.decode.ungathered import Found, decode_fields
from wdsloader.decode.variants import Variants
from wdsloader.decode.walk import skip_pax
from wdsloader.errors import ShardFormatError, WdsLoaderError
from wdsloader.format.manifest import FieldSpec, ShardInfo
from wdsloader.format.ustar import BLOCK, NAME, checksum_ok, checksums_ok
from wdsloader.io.buffers import BufferPool


@dataclass(slots=True, frozen=True)
class _Heads:
    """What the first headers of a batch tell the member checks of ``_gather``: their name
    fields and where each key ends; and the data positions of the members the batch's walk
    over its headers found (named and checksummed already), by extension."""

    names: np.ndarray
    ends: np.ndarray
    walked: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


class ColumnarDecoder:
    """Decodes batches of ``shards`` as columns: the ``fields`` (and the curriculum's variants,
    ``variants``) that are fixed-size ``.npy`` fields of the shards' layout, and the bytes
    fields whose members have one size in the layout (declared ``uint8``: an array; else a
    list of ``bytes``), are gathered; the other fields are decoded by ``decoder`` (a bytes
    field's members found by one walk over the batch's headers). ``sources`` names each shard in errors.

    ``tables`` is empty when no requested field can be gathered (the caller then decodes rows),
    and also when the ``npy`` encoding has a decoder other than the built-in one: a gathered
    value is always what the decoder would return.
    """

    def __init__(
        self,
        schema: Mapping[str, FieldSpec],
        fields: Sequence[str],
        dims: Mapping[str, int],
        shards: Sequence[ShardInfo],
        sources: Sequence[str],
        decoder: SampleDecoder,
        variants: Variants | None,
    ) -> None:
        self.fields = tuple(fields)
        self.sources = list(sources)
        self.decoder = decoder
        self.variants = variants
        self.tables: dict[str, FieldTable] = {}
        raw = [f for f in fields if decoder.field_decoder(f)[1] is decode_uint8]
        blobs = [f for f in fields if decoder.field_decoder(f)[1] is decode_bytes]
        if decoder.npy_is_builtin:
            wanted = [*fields, *(variants.curriculum.fields if variants else ())]
            self.tables = field_tables(schema, wanted, dims, shards, raw, blobs)
        elif raw or blobs:
            self.tables = field_tables(schema, [*raw, *blobs], dims, shards, raw, blobs)
        self.others = [f for f in fields if f not in self.tables]
        self.optional = frozenset(f for f in self.others if schema[f].optional)
        self.blobs = tuple(f for f in [*raw, *blobs] if f in self.others)  # sizes vary: walked
        # the batch arrays of long rows: reused once nothing holds a batch (no page faults)
        self.out_pool = BufferPool(keep=4, populate=True)
        # per shard: where parsing starts for the fields that are not gathered
        exts = [schema[f].ext.lower() for f in self.others]
        self.parse_from = np.array(
            [
                0 if any(e in (s.layout or {}) for e in exts) else prefix_end(s.layout)
                for s in shards
            ],
            dtype=np.int64,
        )
        # per shard: where the walk over the headers of the other fields' members starts (one
        # offset for shards whose layouts differ only from there on)
        walk_from = np.array([walk_start(s.layout, exts) for s in shards], dtype=np.int64)
        self.layout_id, self.block_lens = block_plan(self.tables, len(shards))
        # per shard its layout group: a batch that mixes groups is decoded group by group
        self.group = layout_groups(self.layout_id, walk_from)
        # where the members of the other fields lie: one walk over the batch's headers
        self.finder = MemberFinder(
            shards, walk_from, self.parse_from, decoder, self.others, self.sources, self.group
        )
        # per layout: the headers of a sample that passed every check, to check batches against
        learns = variants is None and not self.optional and bool(self.block_lens.any())
        self.templates = Templates(self.tables, self.layout_id, walk_from) if learns else None

    @property
    def useful(self) -> bool:
        """Whether whole batches are decoded here: a requested field is gathered, or is a
        bytes field (found by one walk over the batch's headers, not by parsing each
        sample)."""
        return bool(self.tables) or bool(self.blobs) or self.images

    @property
    def images(self) -> bool:
        """Whether a requested field is an image the image decoder decodes (a batch's images
        are found by one walk and decoded straight into one batch array)."""
        return any(is_image_decoder(getattr(fn, "fn", fn)) for fn in self._other_fns())

    def _other_fns(self) -> list[Any]:
        return [self.decoder.field_decoder(f)[1] for f in self.others]

    def placement(self) -> Placement:
        """The requested fields the batch reader may read straight into batch arrays (this
        decoder checks them and hands them out; see :mod:`wdsloader.decode.placement`)."""
        wanted = {f: t for f, t in self.tables.items() if f in self.fields}
        return Placement(wanted, self.out_pool)

    # -- the batch -----------------------------------------------------------------------------
    def decode(self, raw: RawBatch, epoch: int, forced: int | None) -> Columns | NotGatherable:
        """The batch as :class:`Columns`, or why it cannot be (:class:`NotGatherable`).

        A batch whose shards belong to several layout groups is decoded group by group
        (:mod:`wdsloader.decode.layouts`). First every structural check (headers, layout,
        ``.npy`` headers), then the decoders;
        raises :class:`ShardFormatError` when a member lies elsewhere than the manifest's
        layout says (the manifest does not describe the shard). A batch that is not gatherable
        has its placed bytes back in its read buffer, for the row decoder.
        """
        groups = self.group[raw.shard]
        if len(groups) and (groups != groups[0]).any():
            rows = [np.flatnonzero(groups == g) for g in np.unique(groups).tolist()]
            out = by_rows(raw, rows, lambda sub: self._columns(sub, epoch, forced))
        else:
            out = self._columns(raw, epoch, forced)
        if isinstance(out, NotGatherable) and raw.placed:
            restore(raw.buf, raw.placed)
        return out

    def _columns(self, raw: RawBatch, epoch: int, forced: int | None) -> Columns | NotGatherable:
        if raw.buf is None:
            return NotGatherable("a byte range of the batch could not be read")
        read = self.templates.read(raw) if self.templates is not None else None
        if read is not None:  # every header checked in one pass against its layout's template
            return self._from_template(raw, read)
        block = self._block(raw)
        first = self._heads(raw, block)
        if isinstance(first, NotGatherable):
            return first
        keys, heads = first
        found: Found = {}
        if self.others:
            walked = self._find_others(raw, keys, block, heads)
            if isinstance(walked, NotGatherable):
                return walked
            found = walked
        gathered: dict[str, Any] = {}
        for name in self.fields:
            if name in self.tables:
                values = self._gather(name, raw, block, heads)
                if isinstance(values, NotGatherable):
                    return values
                gathered[name] = values
        steered = self._steer(raw, keys, block, heads, epoch, forced)
        if isinstance(steered, NotGatherable):
            return steered
        errors: dict[int, WdsLoaderError] = {}
        decoded = self._decode_others(raw, keys, found, errors) if self.others else {}
        columns: dict[str, Any] = {"__key__": keys}
        for name in self.fields:
            columns[name] = gathered[name] if name in gathered else decoded[name]
        columns.update(steered)
        parsed = len(keys) if isinstance(found, list) else 0  # members parsed one by one
        if self.templates is not None and isinstance(found, dict) and block is not None:
            self.templates.learn(raw, found, heads.ends)
        return Columns(columns, dict(sorted(errors.items())), parsed)

    def _from_template(self, raw: RawBatch, read: Read) -> Columns:
        """The batch's columns from what its template read (gathered fields, keys, where the
        other fields' members lie), the other fields decoded as ever."""
        errors: dict[int, WdsLoaderError] = {}
        decoded = self._decode_others(raw, read.keys, read.found, errors) if self.others else {}
        columns: dict[str, Any] = {"__key__": read.keys}
        for name in self.fields:
            columns[name] = read.gathered[name] if name in read.gathered else decoded[name]
        return Columns(columns, dict(sorted(errors.items())), 0)

    def _steer(
        self,
        raw: RawBatch,
        keys: list[str],
        block: np.ndarray | None,
        heads: _Heads,
        epoch: int,
        forced: int | None,
    ) -> dict[str, Any] | NotGatherable:
        """The curriculum's output columns: each sample's variant gathered (or zeros)."""
        if self.variants is None:
            return {}
        curriculum = self.variants.curriculum
        variants = self.variants.draw(keys, epoch, forced)
        zero = self.variants.zero
        out = np.zeros((len(keys), *zero.shape), dtype=zero.dtype)
        for j in range(len(curriculum.names)):
            name = curriculum.field_of(j)
            mask = variants == j
            if name is None or not mask.any():
                continue
            values = self._gather(name, raw, block, heads, mask)
            if isinstance(values, NotGatherable):
                return values
            out[mask] = values
        columns = {curriculum.output: out}
        if curriculum.index_output:
            columns[curriculum.index_output] = variants
        return columns

    def _heads(
        self, raw: RawBatch, block: np.ndarray | None
    ) -> tuple[list[str], _Heads] | NotGatherable:
        """The keys of the batch from the samples' first headers (their checksums checked),
        and what ``_gather`` needs to check member headers. A corrupt first header is not
        gatherable: the row decoder raises or skips it, naming its offset."""
        assert raw.buf is not None
        first = gather_rows(raw.buf, raw.start, BLOCK) if block is None else block
        if first is not None:  # adopted webdataset shards: a PAX header leads each member
            past = skip_pax(raw.buf, raw.start, first[:, :BLOCK])
            first = None if past is None else past[1]
        ends = None if first is None else key_ends(first)
        if first is None or ends is None or not checksums_ok(first).all():
            return NotGatherable("a first header is not a plain ustar header of KEY.EXT")
        return key_strings(first, ends), _Heads(first[:, NAME], ends)

    def _block(self, raw: RawBatch) -> np.ndarray | None:
        """The first bytes of every sample (its layout's block length) as one ``(n, L)``
        array, when the batch's shards share one layout and the requested fields fill most of
        those bytes (one gather then serves keys, fields and the first variable header); else
        None."""
        ids = self.layout_id[raw.shard]
        if ids[0] < 0 or (ids != ids[0]).any():
            return None
        length = int(self.block_lens[ids[0]])
        if not length or (raw.stop - raw.start).min() < length:
            return None
        assert raw.buf is not None
        return gather_rows(raw.buf, raw.start, length)

    @property
    def block_len(self) -> int:
        """The longest sample prefix gathered in one piece (0: none, fields one by one)."""
        return int(self.block_lens.max(initial=0))

    def _gather(
        self,
        name: str,
        raw: RawBatch,
        block: np.ndarray | None,
        heads: _Heads,
        mask: np.ndarray | None = None,
    ) -> np.ndarray | list[bytes] | NotGatherable:
        """Field ``name`` of the batch's samples (those in ``mask``) as one array (a copy),
        after checking that each gathered member header is this sample's member of the field,
        with a sound checksum (``heads``: from ``_heads``)."""
        table = self.tables.get(name)
        if table is None:
            return NotGatherable(f"field {name!r} is not a fixed-size field of the layout")
        buf = raw.buf
        assert buf is not None
        rows = np.arange(len(raw.start)) if mask is None else np.flatnonzero(mask)
        span = positions = None
        if block is not None:
            offset = int(table.offsets[raw.shard[0]])
            span = block[:, offset - BLOCK : offset + table.nbytes]
            span = span if mask is None else span[mask]
            headers = span[:, :BLOCK]
        else:
            positions = table.positions(raw.start[rows], raw.shard[rows])
            found = None if positions is None else gather_rows(buf, positions - BLOCK, BLOCK)
            if found is None:
                return NotGatherable(f"field {name!r} lies outside the layout of a shard")
            headers = found
        at = raw.start[rows] + table.offsets[raw.shard[rows]]
        walked = heads.walked.get(table.ext)
        if walked is None or not np.array_equal(walked[rows], at):  # else: checked in the walk
            ok = named_members(
                headers, heads.names[rows], heads.ends[rows], table.ext, table.nbytes
            )  # fmt: skip
            first = at - raw.start[rows] == BLOCK  # a first header: checked already
            if not first.all():
                ok &= first | checksums_ok(headers)
            if raw.placed and not ok.all():
                restore(buf, raw.placed)  # the parser compares the bytes the shard has there
            for j in rows[~ok].tolist():
                why = self._check_member(name, table, raw, j)
                if why is not None:
                    return why
        return self._values(name, table, raw, span, positions, None if mask is None else rows)

    def _values(
        self,
        name: str,
        table: FieldTable,
        raw: RawBatch,
        span: np.ndarray | None,
        positions: np.ndarray | None,
        picked: np.ndarray | None,
    ) -> np.ndarray | list[bytes] | NotGatherable:
        """Field ``name``'s values, its member headers checked: from the batch's first bytes
        ``span``, the rows the reader placed, or the read buffer at ``positions``; ``picked``:
        the samples wanted (None: all). An undeclared bytes field's values are ``bytes``."""
        buf = raw.buf
        assert buf is not None
        placed = raw.placed.get(name)
        values: np.ndarray | list[bytes] | None
        if span is not None:
            values = table.from_block(span, BLOCK)
        elif placed is not None and isinstance(placed.rows, list):  # read into bytes already
            values = placed.rows if picked is None else [placed.rows[j] for j in picked.tolist()]
        elif placed is not None:
            assert positions is not None and isinstance(placed.rows, np.ndarray)
            got = placed.rows if picked is None else placed.rows[picked]
            values = placed_values(table, buf, positions, got)
        elif table.as_bytes:
            assert positions is not None
            view = memoryview(buf)  # type: ignore[arg-type]
            values = [bytes(view[p : p + table.nbytes]) for p in positions.tolist()]
        else:
            assert positions is not None
            values = table.gather(buf, positions, self.out_pool)
        if values is None:
            return NotGatherable(f"field {name!r}: .npy headers differ from the schema's")
        if table.as_bytes and isinstance(values, np.ndarray):
            return [row.tobytes() for row in values]
        return values

    def _check_member(
        self, name: str, table: FieldTable, raw: RawBatch, j: int
    ) -> NotGatherable | None:
        """Sample ``j``'s member of field ``name`` where the layout puts it, checked by parsing
        the sample: the same bytes pass (None); a sample that does not parse, or lacks the
        member, is left to the row decoder; a member elsewhere means the manifest's layout does
        not describe this shard: a :class:`ShardFormatError` naming shard, sample and field."""
        start, stop, base = int(raw.start[j]), int(raw.stop[j]), int(raw.base[j])
        source = self.sources[raw.shard[j]]
        try:
            key, members = parse_sample(raw.data[j], start, stop, base_offset=base, source=source)
        except WdsLoaderError:
            return NotGatherable(f"sample #{int(raw.local[j])} of {source} does not parse")
        member = members.get(table.ext)
        if member is None:
            return NotGatherable(f"sample {key!r} of {source} has no member .{table.ext}")
        offset = int(table.offsets[raw.shard[j]])
        at = start + offset
        assert raw.buf is not None
        if member.nbytes == table.nbytes and member == raw.buf[at : at + table.nbytes].data:
            return None
        header = raw.buf[at - BLOCK : at].tobytes()
        there = header[NAME].split(b"\0", 1)[0].decode("utf-8", "replace")
        sound = len(header) == BLOCK and checksum_ok(header)
        found = f"the header of {there!r}" if sound else "no such member header"
        raise ShardFormatError(
            f"{source}: sample {key!r}, field {name!r}: the manifest's layout puts the member "
            f"{key}.{table.ext} at byte {offset} of the sample (byte {base + at} of the shard), "
            f"where the shard has {found}: the manifest does not describe this shard (rebuild "
            "or re-adopt it; gather=False reads it by parsing)"
        )

    # -- the fields that are not gathered -------------------------------------------------------
    def _find_others(
        self, raw: RawBatch, keys: list[str], block: np.ndarray | None, heads: _Heads
    ) -> Found | NotGatherable:
        """Where the members of the fields that are not gathered lie: found for the whole batch
        at once (checking only the headers after the constant-offset prefix, where an earlier
        batch of the same layout found them, else walking them; a batch whose samples come
        from shards of different layouts is walked one layout group at a time; the members
        found so, their headers checked, are noted in ``heads``), else by parsing each
        sample."""
        members = self.finder.find(raw, keys, heads.names, heads.ends, block)
        if isinstance(members, NotGatherable) and raw.placed:
            # the fields read into batch arrays left their bytes out of the read buffer: a
            # member where the layout did not say would be lost in that gap; look again with
            # them back (a layout that lies is then named by ``_gather``'s member check)
            assert raw.buf is not None
            restore(raw.buf, raw.placed)
            members = self.finder.find(raw, keys, heads.names, heads.ends, block)
        if not isinstance(members, dict):
            return members  # parsed sample by sample (or not even that)
        # a gathered field's members were found by the walk: ``_gather`` need not check their
        # headers again, unless one's size is not the layout's (then its check words the error)
        sizes = {table.ext: table.nbytes for table in self.tables.values()}
        heads.walked.update(
            {
                ext: pos
                for ext, (pos, size) in members.items()
                if ext not in sizes or bool((size == sizes[ext]).all())
            }
        )
        for field in self.others:
            ext = self.decoder.field_decoder(field)[0]
            if ext not in members and field not in self.optional:
                return NotGatherable(f"the samples have no member .{ext} (field {field!r})")
        return members

    def _decode_others(
        self, raw: RawBatch, keys: list[str], found: Found, errors: dict[int, WdsLoaderError]
    ) -> dict[str, list[Any]]:
        """Decode the fields that are not gathered (:func:`decode_fields`; into the pool)."""
        fields, pool = self.others, self.out_pool
        return decode_fields(raw, keys, found, fields, self.decoder, self.sources, errors, pool)
