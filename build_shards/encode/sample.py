"""Encode sample fields as tar members without pickle, and check every sample against a schema.

Encodings (the member extension is ``wdsloader.format.member_ext(field, encoding)``):

==============================================  =========================================
value                                           member
==============================================  =========================================
numpy array, torch tensor                       ``.npy`` (``allow_pickle=False``; object
                                                dtypes refused; C order, little-endian)
``str``                                         ``.txt`` (UTF-8)
``int``, numpy integer scalar                   ``.cls`` (decimal text)
``float``, ``bool``, ``list``, ``dict``, None   ``.json``
PIL image                                       ``.png``, or the field's ``.jpg``/``.png``/
                                                ``.webp``
``bytes``                                       only with an explicit extension in the
                                                field name: ``"image.jpg": b"..."``
any value, under a user codec's encoding        that codec's ``encode`` (see
                                                :func:`wdsloader.format.register_codec`)
==============================================  =========================================

A sample dict's names are field names, optionally with an explicit extension
(``"image.jpg"`` is the field ``image`` stored as ``jpg``). The schema is inferred from the first
samples and/or declared (:mod:`build_shards.probe.infer`); :class:`SampleEncoder` checks every sample
against it (field set, encoding, dtype, shape with symbolic dims, NaN/Inf, declared ranges) and
raises :class:`~wdsloader.errors.SchemaError` naming the sample key and the field. A sample may lack an
``optional`` field (or hold None in it): it then has no member for it (a JSON field stores None
as ``null``), and within grouped fields no entry.

A value the loader could not give back as it was written is refused the same way: a ``.cls``
int outside the field's dtype (int64 for Python ints), a str that is not valid Unicode
(surrogates), raw bytes under ``.txt``/``.jsn``/``.id``-like extensions that their default
decoder cannot read, JSON with non-str dict keys, nesting deeper than 200 levels or a bare int
beyond int64, and a member name ``KEY.EXT`` over the 100-byte tar limit. Tuples in JSON read
back as lists, numpy values in JSON as Python numbers and lists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from build_shards.encode.field_encoder import make_encoder
from build_shards.encode.schema import declare_hint, parse_name
from wdsloader.errors import SchemaError
from wdsloader.format import FieldSpec
from wdsloader.format.codecs import Codec, get_codec, is_library_codec
from wdsloader.format.ustar import MAX_NAME_BYTES

_NAMES_CACHE_MAX = 64  # sets of sample names already checked against the schema


class SampleEncoder:
    """Checks samples against ``schema`` and turns them into ordered tar members.

    Members come in the same order in every sample: fixed-size fields (npy with a fixed shape)
    sorted by field name, then the others sorted by name; the schema dict is in that order.
    Fields marked ``grouped`` (see :mod:`wdsloader.format.groups`) are checked by their own
    encoder and written together as one JSON object member, where the first of them would be.
    """

    def __init__(
        self, schema: Mapping[str, FieldSpec], dims: Mapping[str, int], *, allow_nan: bool = False
    ) -> None:
        self.schema = dict(schema)
        self.dims = dict(dims)
        self.allow_nan = allow_nan
        for spec in self.schema.values():
            for d in spec.shape or ():
                if isinstance(d, str) and d not in self.dims:
                    raise SchemaError(f"symbolic dim {d!r} is not bound (pass dims={{{d!r}: N}})")
        fixed = sorted(f for f, s in self.schema.items() if s.fixed_size)
        self.order: list[str] = fixed + sorted(f for f in self.schema if f not in fixed)
        # user codecs resolved here travel with the encoder to worker processes, where they may
        # not be registered
        self.codecs: dict[str, Codec] = {}
        for f, spec in self.schema.items():
            codec = get_codec(spec.encoding)
            if codec is not None and not is_library_codec(codec):
                self.codecs[f] = codec
        self._setup()

    def _setup(self) -> None:
        self._exts = [self.schema[f].ext for f in self.order]
        # a key longer than this many characters may make a member name over the tar limit
        self._safe_key_len = (MAX_NAME_BYTES - 1 - max(map(len, self._exts), default=0)) // 4
        self._encoders = [
            make_encoder(f, self.schema[f], self.dims, self.allow_nan, self.codecs.get(f))
            for f in self.order
        ]
        # per field: None, or the JSON text before its value in the grouped member
        self._group_keys = [
            f"{json.dumps(f)}:".encode() if self.schema[f].grouped else None for f in self.order
        ]
        self._texts = [self.schema[f].encoding == "txt" for f in self.order]
        # per field: whether None is stored as an absent member (optional, not JSON)
        self._absent = [
            bool(self.schema[f].optional) and self.schema[f].encoding != "json" for f in self.order
        ]
        self._names: dict[str, tuple[str, str | None]] = {}
        self._orders: dict[tuple[str, ...], tuple[str | None, ...]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "dims": self.dims,
            "allow_nan": self.allow_nan,
            "order": self.order,
            "codecs": self.codecs,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _parse(self, name: str) -> tuple[str, str | None]:
        got = self._names.get(name)
        if got is None:
            got = self._names[name] = parse_name(name)
        return got

    def _check_names(self, key: str, names: tuple[str, ...]) -> tuple[str | None, ...]:
        """The sample's names in member order (None for an optional field it lacks), or
        SchemaError when they do not fit the schema (an explicit extension other than the
        schema's, a field twice, missing or extra)."""
        by_field: dict[str, str] = {}
        for name in names:
            field, explicit = self._parse(name)
            spec = self.schema.get(field)
            if spec is not None and explicit is not None and explicit != spec.encoding:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: stored as .{explicit} here but as "
                    f".{spec.encoding} in the schema{declare_hint(field, encoding=explicit)}"
                )
            if field in by_field:
                raise SchemaError(f"sample {key!r}: field {field!r} appears twice")
            by_field[field] = name
        missing = sorted(f for f in self.order if f not in by_field and not self.schema[f].optional)
        extra = sorted(f for f in by_field if f not in self.schema)
        if missing or extra:
            raise SchemaError(
                f"sample {key!r}: fields differ from the schema: missing {missing}, "
                f"unexpected {extra}"
                + (
                    declare_hint(missing[0], optional=True)
                    if missing
                    else declare_hint(extra[0], encoding="json", optional=True)
                )
            )
        return tuple(by_field.get(f) for f in self.order)

    def _check_member_names(self, key: str) -> None:
        """SchemaError unless every member name ``KEY.EXT`` fits a tar header."""
        try:
            nkey = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise SchemaError(f"sample {key!r}: the key is not valid Unicode ({exc})") from None
        for field, ext in zip(self.order, self._exts, strict=True):
            if nkey + 1 + len(ext.encode("utf-8")) > MAX_NAME_BYTES:
                raise SchemaError(
                    f"sample {key!r}: field {field!r}: the member name {key}.{ext} is longer "
                    f"than {MAX_NAME_BYTES} bytes (the tar name limit): use a shorter key or "
                    "field name"
                )

    def encode(self, key: str, sample: Mapping[str, Any]) -> tuple[list[tuple[str, bytes]], bool]:
        """``(members, nonfinite)`` for one sample; ``nonfinite`` is True when a float held NaN
        or Inf (only possible with ``allow_nan``)."""
        names = tuple(sample)
        ordered = self._orders.get(names)
        if ordered is None:  # the names are checked once per set (and order) of names
            ordered = self._check_names(key, names)
            if len(self._orders) < _NAMES_CACHE_MAX:
                self._orders[names] = ordered
        if len(key) > self._safe_key_len:
            self._check_member_names(key)
        members: list[tuple[str, bytes]] = []
        nonfinite = False
        group: list[bytes] = []
        at = -1  # where the grouped member goes
        for name, ext, enc, gkey, text, absent in zip(
            ordered, self._exts, self._encoders, self._group_keys, self._texts, self._absent,
            strict=True,
        ):  # fmt: skip
            if gkey is not None and at < 0:
                members.append((ext, b""))  # its place (even if every entry is absent)
                at = len(members) - 1
            if name is None:
                continue  # an optional field the sample lacks
            value = sample[name]
            if value is None and absent:
                continue  # None in an optional field: stored as a missing member
            data, bad = enc(key, value)
            nonfinite = nonfinite or bad
            if gkey is None:
                members.append((ext, data))
                continue
            # cls and json members are JSON text already; a txt member becomes a JSON string
            group.append(gkey + (_JSON_STR.encode(data.decode("utf-8")).encode() if text else data))
        if at >= 0:
            members[at] = (members[at][0], b"{" + b",".join(group) + b"}")
        return members, nonfinite


_JSON_STR = json.JSONEncoder(ensure_ascii=False)
