"""Grouped small fields: a sample's small scalar fields stored as one JSON member.

A tar member costs at least 1,024 bytes (a 512-byte header, the data padded to 512), so a
sample of four 10-byte fields takes 4 KiB as four members. With grouping, the builder writes
them as one member ``KEY.fields.json`` holding a JSON object ``{"field": value, ...}`` (keys in
the schema's field order). The manifest marks each such field ``"grouped": true`` with
``"ext": "fields.json"`` and keeps its own ``encoding`` and ``dtype``: the loader reads the
value from the object and gives it back exactly as the field's own member would have been read
(a ``cls`` int cast to its dtype, a ``txt`` str, a ``json`` value). Other WebDataset readers
see one member ``fields.json`` (a dict once decoded) instead of the separate fields.

Which fields are small is decided once, from the schema and the build's first sample (every
sample of a split has the same members): ``cls`` ints, ``json`` scalars (a float, bool, None or
int), and ``txt`` strings of at most :data:`SMALL_TEXT_BYTES` UTF-8 bytes in the first sample.
Grouping happens only when at least two fields qualify (one member either way otherwise).
"""

from __future__ import annotations

GROUP_FIELD = "fields"
"""The name of the grouped member's field: the member is ``KEY.fields.json``."""
GROUP_EXT = f"{GROUP_FIELD}.json"
SMALL_TEXT_BYTES = 512
"""A ``txt`` field is small when its first value has at most this many UTF-8 bytes: as a member
of its own it would cost at least 1,024 bytes, twice this (header and padding)."""
MIN_GROUPED = 2
"""Fewest small fields worth grouping (a group of one saves nothing)."""
