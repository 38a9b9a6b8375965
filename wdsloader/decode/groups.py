"""Reading grouped small fields (:mod:`wdsloader.format.groups`): the value of one field from
the sample's JSON object member, as the field's own member would have been decoded."""

from __future__ import annotations

import json
from typing import Any

from wdsloader.decode.codecs import Buffer, Decoder, decode_int, decode_json, decode_text
from wdsloader.errors import DecodeError

# the built-in decoder of each groupable encoding, and the JSON type its value has
_BUILTIN: dict[str, tuple[Decoder, tuple[type, ...]]] = {
    "cls": (decode_int, (int,)),
    "txt": (decode_text, (str,)),
    "json": (decode_json, (object,)),
}


class GroupedValue:
    """Decode field ``name`` (of ``encoding``) from a grouped member's bytes.

    With the built-in decoder of ``encoding`` (``fn``) the JSON value is the decoded value (a
    ``cls`` int, a ``txt`` str, a ``json`` value; type-checked); another decoder (passed with
    ``decoders=``) gets the bytes the field's own member would have held. A class, so it
    pickles to worker processes. An ``optional`` field without an entry reads as None.
    """

    __slots__ = ("name", "encoding", "fn", "types", "optional")

    def __init__(self, name: str, encoding: str, fn: Decoder, optional: bool = False) -> None:
        self.name = name
        self.encoding = encoding
        self.optional = optional
        builtin, types = _BUILTIN[encoding]
        self.fn = None if fn is builtin else fn
        self.types = types

    def __call__(self, buf: Buffer) -> Any:
        obj = decode_json(buf)
        if not isinstance(obj, dict):
            raise DecodeError(f"the grouped member holds a {type(obj).__name__}, not an object")
        try:
            value = obj[self.name]
        except KeyError:
            if self.optional:
                return None
            raise DecodeError(
                f"the grouped member has no entry {self.name!r} (it has {sorted(obj)[:20]})"
            ) from None
        if self.fn is not None:
            return self.fn(_member_bytes(self.encoding, value))
        if not isinstance(value, self.types) or isinstance(value, bool) and self.types == (int,):
            raise DecodeError(
                f"grouped entry {self.name!r} is a {type(value).__name__}, not a "
                f"{self.encoding} value"
            )
        return value

    def __eq__(self, other: object) -> bool:
        mine = (self.name, self.encoding, self.fn, self.optional)
        return isinstance(other, GroupedValue) and mine == (
            other.name,
            other.encoding,
            other.fn,
            other.optional,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.encoding))

    def __repr__(self) -> str:
        return f"GroupedValue({self.name!r}, {self.encoding!r})"


def _member_bytes(encoding: str, value: Any) -> bytes:
    """The bytes the field's own member would hold (what the builder writes)."""
    if encoding == "txt":
        return str(value).encode("utf-8")
    if encoding == "cls":
        return str(value).encode()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
