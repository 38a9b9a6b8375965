"""The walk over the members of a batch whose sizes vary: every sample's headers checked and
its members found, for the whole batch at once.

:func:`walk_members` steps from member to member, one numpy pass per step over all samples
(the next header of every sample: checksum, name, size). When a walk over an earlier batch of
the same shard layout left its steps (:class:`WalkSteps`: where each header sat relative to the
sample's start), :func:`walk_steps` checks all those headers at once instead, in a few numpy
passes over one gather; it accepts exactly what the step-by-step walk accepts, and returns None
(the caller then walks step by step) for anything else.

PAX extended headers (webdataset's ``ShardWriter`` writes one before every member) are skipped
when their records change neither the name nor the size of the member that follows
(:func:`skip_pax`). Anything unexpected makes these functions return None, and the caller falls
back to parsing sample by sample, which also words the errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wdsloader.decode.gather import gather_rows
from wdsloader.format.ustar import (
    BLOCK,
    NAME,
    PREFIX,
    TYPEFLAG,
    checksums_ok,
    header_sizes,
    name_fields,
    plain_regular,
)

MAX_MEMBERS = 64
_PAX = ord("x")
# the PAX records that change a member's name, size or data (a sparse member: the parser refuses)
_PAX_OVERRIDES = (b"path=", b"size=", b"GNU.sparse.")
_NAME_BYTES = NAME.stop - NAME.start
_REGULAR = np.array([0, ord("0"), ord("7")], dtype=np.uint8)

Found = dict[str, tuple[np.ndarray, np.ndarray]]
"""``{ext: (data positions, sizes)}``: where each sample's member of each extension lies."""


class WalkSteps:
    """The headers one walk passed, in order: ``offsets[i]`` from each sample's start, the
    member's extension as written in its name (``names[i]``; None for a PAX header); and what
    :func:`walk_steps` compares headers with, computed once."""

    __slots__ = ("members", "names", "offsets", "pax", "rel", "tail_mask", "tails")

    def __init__(self, offsets: Sequence[int], names: Sequence[bytes | None]) -> None:
        self.offsets = tuple(offsets)
        self.names = tuple(names)
        self.rel = np.array(self.offsets, dtype=np.int64)
        self.pax = np.array([name is None for name in self.names], dtype=bool)
        self.members = np.flatnonzero(~self.pax)
        exts = [name + b"\0" for name in self.names if name is not None]
        width = max(map(len, exts), default=0)
        self.tails = np.zeros((len(exts), width), dtype=np.uint8)
        self.tail_mask = np.zeros((len(exts), width), dtype=bool)
        for i, ext in enumerate(exts):
            self.tails[i, : len(ext)] = np.frombuffer(ext, dtype=np.uint8)
            self.tail_mask[i, : len(ext)] = True


class KeyNames:
    """The samples' ``KEY.`` prefixes, as bytes and, when they have one length (the usual
    case), as one ``(n, L)`` uint8 array."""

    __slots__ = ("prefixes", "rows")

    def __init__(self, keys: Sequence[str], names: np.ndarray | None, ends: np.ndarray | None):
        """``names``/``ends``: the first headers' name fields and where each key ends
        (:func:`wdsloader.decode.gather.key_ends`), when the caller has them: then the rows are
        a view of them, nothing encoded."""
        self.rows: np.ndarray | None = None
        self.prefixes: list[bytes] | None = None
        if names is not None and ends is not None and len(ends) and (ends == ends[0]).all():
            self.rows = names[:, : int(ends[0]) + 1]
            return
        prefixes = [k.encode("utf-8", "surrogateescape") + b"." for k in keys]
        self.prefixes = prefixes
        width = len(prefixes[0]) if prefixes else 0
        joined = b"".join(prefixes)
        if prefixes and len(joined) == width * len(prefixes):
            if all(len(p) == width for p in prefixes):
                rows = np.frombuffer(joined, dtype=np.uint8)
                self.rows = rows.reshape(len(prefixes), width)

    def first(self) -> bytes:
        """The first sample's prefix."""
        if self.rows is not None:
            return self.rows[0].tobytes()
        assert self.prefixes is not None
        return self.prefixes[0]

    def all_named(self, names: np.ndarray, ext: bytes) -> bool:
        """Whether every row of ``names`` (ustar name fields) is its sample's ``KEY.`` and
        ``ext``, then a NUL (or the end of the field)."""
        width = names.shape[1]
        if self.rows is not None:
            n = self.rows.shape[1]
            tail = np.frombuffer(ext + b"\0", dtype=np.uint8)[: width - n]
            return bool(
                np.array_equal(names[:, :n], self.rows)
                and (names[:, n : n + len(tail)] == tail).all()
            )
        assert self.prefixes is not None
        blob = names.tobytes()
        for i, prefix in enumerate(self.prefixes):
            name = prefix + ext
            at = i * width
            if blob[at : at + len(name)] != name or (len(name) < width and blob[at + len(name)]):
                return False
        return True


def header_rows(buf: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    """The 512-byte headers at ``positions`` as one ``(n, 512)`` array (None when one would
    leave the buffer): a plain index into the buffer's blocks when every position is a
    multiple of 512 (tar headers of a read that starts at a sample), else a gather."""
    if len(positions) and not (positions & (BLOCK - 1)).any():
        if positions.min() < 0 or positions.max() + BLOCK > len(buf):
            return None
        blocks = buf[: len(buf) // BLOCK * BLOCK].reshape(-1, BLOCK)
        return blocks[positions >> 9]
    return gather_rows(buf, positions, BLOCK)


def skip_pax(
    buf: np.ndarray, pos: np.ndarray, headers: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Past the PAX extended headers at ``pos`` (``headers``: the ``(n, 512)`` headers there),
    when every one is a PAX header with a sound checksum whose records change neither the name
    nor the size of the member that follows (webdataset's ``ShardWriter`` writes one with the
    mtime before every member): ``(positions after them, the headers there)``. Unchanged when
    none is a PAX header; None when only some are, or a record names a path or a size (the
    caller then parses sample by sample)."""
    flags = headers[:, TYPEFLAG.start]
    is_pax = flags == _PAX
    if not is_pax.any():
        return pos, headers
    if not is_pax.all() or not checksums_ok(headers).all():
        return None
    sizes = header_sizes(headers)
    if sizes is None or not _pax_data_plain(buf, pos + BLOCK, sizes):
        return None
    after = pos + BLOCK + (sizes + BLOCK - 1) // BLOCK * BLOCK
    found = header_rows(buf, after)
    return None if found is None else (after, found)


def _pax_data_plain(buf: np.ndarray, data: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether the PAX records at ``data`` (``sizes`` bytes each, at most 512) name neither a
    path nor a size (bytes past a record's end may hold a match too: only a false alarm)."""
    if not len(sizes):
        return True
    if int(sizes.max()) > BLOCK:
        return False
    rows = gather_rows(buf, data, int(sizes.max()))
    if rows is None:
        return False
    blob = rows.tobytes()
    return not any(word in blob for word in _PAX_OVERRIDES)


def walk_members(
    buf: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    keys: KeyNames,
    first_headers: np.ndarray | None = None,
    first_checked: bool = False,
) -> tuple[Found, WalkSteps] | None:
    """The members lying in ``buf[starts[j]:stops[j]]`` for every sample ``j`` at once, and the
    steps of the walk. ``first_headers`` may hold the ``(n, 512)`` headers at ``starts`` when the
    caller has them already (``first_checked``: and their checksums).

    Every sample must hold the same extensions in the same order, in plain ustar headers named
    ``KEY.EXT`` with the sample's own key and sound checksums; otherwise None (the caller parses
    sample by sample).
    """
    out: Found = {}
    offsets: list[int] = []
    names: list[bytes | None] = []
    pos = np.asarray(starts, dtype=np.int64)
    for _ in range(MAX_MEMBERS):
        active = pos < stops
        if not active.any():
            return out, WalkSteps(_constant(offsets), tuple(names))
        if not active.all():
            return None  # samples with different numbers of members
        checked = False
        headers: np.ndarray | None
        if first_headers is not None:
            headers, first_headers, checked = first_headers, None, first_checked
        else:
            headers = header_rows(buf, pos)
        if headers is None:
            return None
        skipped = skip_pax(buf, pos, headers)
        if skipped is None:
            return None
        if skipped[0] is not pos:
            offsets.append(_offset(pos, starts))
            names.append(None)
            pos, headers = skipped
            checked = False
        if not (checked or checksums_ok(headers).all()) or not plain_regular(headers):
            return None
        sizes = header_sizes(headers)
        if sizes is None:
            return None
        ext = _common_ext(name_fields(headers), keys)
        name = None if ext is None else ext.decode("utf-8", "surrogateescape").lower()
        if ext is None or name is None or name in out:
            return None
        offsets.append(_offset(pos, starts))
        names.append(ext)
        data = pos + BLOCK
        out[name] = (data, sizes)
        pos = data + (sizes + BLOCK - 1) // BLOCK * BLOCK
        if (pos > stops).any():
            return None
    return None


def _offset(pos: np.ndarray, starts: np.ndarray) -> int:
    """The offset of ``pos`` from ``starts`` when it is one for every sample, else -1."""
    rel = pos - starts
    first = int(rel[0]) if len(rel) else 0
    return first if (rel == first).all() else -1


def _constant(offsets: list[int]) -> tuple[int, ...]:
    """The steps' offsets, or none when one varies between samples (nothing to predict)."""
    return () if -1 in offsets else tuple(offsets)


def _common_ext(names: np.ndarray, keys: KeyNames) -> bytes | None:
    """The extension (as written) shared by ``names`` (rows of ustar name fields), each of
    which must be its sample's ``KEY.`` followed by it; else None."""
    first = names[0].tobytes().split(b"\0", 1)[0]
    prefix = keys.first()
    if not first.startswith(prefix) or len(first) == len(prefix):
        return None
    ext = first[len(prefix) :]
    if b"/" in ext:  # a directory part: the row parser reads another name
        return None
    return ext if keys.all_named(names, ext) else None


def walk_steps(
    buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, keys: KeyNames, steps: WalkSteps
) -> Found | None:
    """:func:`walk_members` when the members lie where ``steps`` (an earlier walk's) says:
    every header of every sample gathered at once and checked as the walk checks it (the same
    PAX headers, checksums, names, sizes, and each member's end where the next header is).
    None when anything differs (the caller then walks step by step)."""
    n, k = len(starts), len(steps.offsets)
    if not k or not n:
        return None
    rel = steps.rel
    flat = header_rows(buf, (starts[:, None] + rel).ravel())
    sizes = None if flat is None else header_sizes(flat)
    if flat is None or sizes is None:
        return None
    sizes = sizes.reshape(n, k)
    # each header ends where the next one starts, the last one where the sample ends
    ends = (sizes + (2 * BLOCK - 1)) // BLOCK * BLOCK + rel
    if not (ends[:, :-1] == rel[1:]).all() or not (ends[:, -1] == stops - starts).all():
        return None
    if not checksums_ok(flat).all():
        return None
    headers = flat.reshape(n, k, BLOCK)
    flags = headers[:, :, TYPEFLAG.start]
    regular = (flags == _REGULAR[0]) | (flags == _REGULAR[1]) | (flags == _REGULAR[2])
    if not np.where(steps.pax, flags == _PAX, regular).all():
        return None
    if (headers[:, :, PREFIX.start] != 0).any(where=~steps.pax):
        return None
    if not _named(headers, keys, steps):
        return None
    if steps.pax.any():
        data = (starts[:, None] + (rel[steps.pax] + BLOCK)).ravel()
        if not _pax_data_plain(buf, data, sizes[:, steps.pax].ravel()):
            return None
    out: Found = {}
    for i in steps.members.tolist():
        name = steps.names[i]
        assert name is not None
        out[name.decode("utf-8", "surrogateescape").lower()] = (
            starts + (rel[i] + BLOCK),
            sizes[:, i],
        )
    return out


def _named(headers: np.ndarray, keys: KeyNames, steps: WalkSteps) -> bool:
    """Whether each member header of the ``(n, k, 512)`` headers (its step's, not a PAX
    header) is named its sample's ``KEY.`` and the extension of its step."""
    if keys.rows is not None:
        key = keys.rows.shape[1]
        end = key + steps.tails.shape[1]
        if end <= _NAME_BYTES:
            names = headers[:, :, :end]  # a view: only the member steps are copied
            if steps.pax.any():
                names = names[:, steps.members]
            same = names[:, :, key:] == steps.tails
            return bool(
                (same | ~steps.tail_mask).all() and (names[:, :, :key] == keys.rows[:, None]).all()
            )
    exts = [name for name in steps.names if name is not None]
    members = steps.members.tolist()
    return all(
        keys.all_named(name_fields(headers[:, i]), ext)
        for i, ext in zip(members, exts, strict=True)
    )
