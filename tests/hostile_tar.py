"""Malformed tar headers for hostile-input tests, and a guard that turns a hang into a failure.

Each case of :data:`CASES` is a sample (key ``KEY``) whose first header (or the extension header
before it) is malformed in one way, with the words its :class:`ShardFormatError` must contain.
:func:`hostile_dataset` writes a one-shard dataset (manifest, index, layout) of good factory
samples followed by one hostile sample.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.dataset_factory import SCHEMA, sample_members
from wdsloader.format import (
    BLOCK,
    END_OF_ARCHIVE,
    Manifest,
    ShardInfo,
    SplitInfo,
    TarStreamWriter,
    decode_index,
    encode_header,
    encode_index,
    encode_member,
    index_path,
    padded,
)

GOOD = 6  # good samples before the hostile one
KEY = f"train{GOOD:07d}"
SHARD = "train/shard-000000.tar"


@contextmanager
def deadline(seconds: float = 10.0) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging when the body runs longer than ``seconds``.

    SIGALRM interrupts a pure-Python loop in the main thread, which is where the parsers run with
    ``num_workers=0`` and one adopt worker.
    """
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs SIGALRM")

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a parse loop that never ends?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def with_checksum(header: bytearray | bytes) -> bytes:
    """``header`` with its checksum field recomputed (so only the field a case breaks is bad)."""
    h = bytearray(header)
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def header(name: str, size: int = 0, typeflag: bytes = b"0", size_field: bytes = b"") -> bytes:
    h = bytearray(encode_header(name, size))
    h[156:157] = typeflag
    if size_field:
        h[124:136] = size_field.ljust(12, b"\0")
    return with_checksum(h)


def extension(typeflag: bytes, data: bytes, size: int | None = None) -> bytes:
    """A PAX (``x``) or GNU long-name (``L``) header with its padded data."""
    name = "././@LongLink" if typeflag == b"L" else "PaxHeader/m"
    head = header(name, len(data) if size is None else size, typeflag)
    return head + data + b"\0" * (padded(len(data)) - len(data))


def record(text: bytes) -> bytes:
    """A well-formed PAX record ``LEN text\\n``."""
    for n in range(1, 200):
        rec = b"%d %s\n" % (n, text)
        if len(rec) == n:
            return rec
    raise AssertionError(text)


def members(key: str = KEY) -> bytes:
    return b"".join(encode_member(f"{key}.{ext}", data) for ext, data in sample_members(GOOD, 0))


def _first_header_with(patch: Callable[[bytearray], None], fix: bool = True) -> bytes:
    body = bytearray(members())
    first = bytearray(body[:BLOCK])
    patch(first)
    body[:BLOCK] = with_checksum(first) if fix else first
    return bytes(body)


def _set(at: slice, value: bytes) -> Callable[[bytearray], None]:
    def patch(h: bytearray) -> None:
        h[at] = value

    return patch


def _flip(h: bytearray) -> None:
    h[3] ^= 0x01


def _pax(*records: bytes) -> bytes:
    return extension(b"x", b"".join(records)) + members()


def _gzipped(data: bytes) -> bytes:
    """``data`` gzip-compressed (a whole tar named .tar, seen from the walk), padded to blocks."""
    packed = gzip.compress(data, mtime=0)
    return packed + b"\0" * (padded(len(packed)) - len(packed))


# name -> (hostile sample bytes, words of the error); the malformed header is the sample's first
CASES: dict[str, tuple[bytes, str]] = {
    "pax_zero_length": (_pax(b"0 path=a\n"), "PAX record"),
    "pax_negative_length": (_pax(b"-9 path=a\n"), "PAX record"),
    "pax_non_numeric_length": (_pax(b"x9 path=a\n"), "PAX record"),
    "pax_no_length": (_pax(b"path=a\n"), "PAX record"),
    "pax_length_past_end": (_pax(b"99 path=a\n"), "PAX record"),
    "pax_length_short": (_pax(b"3 path=a\n"), "PAX record"),
    "pax_key_not_utf8": (_pax(record(b"\xff\xfe=1")), "PAX record"),
    "pax_no_equals": (_pax(record(b"path")), "PAX record"),
    "pax_size_not_numeric": (_pax(record(b"size=12a")), "PAX size"),
    "pax_size_negative": (_pax(record(b"size=-1")), "PAX size"),
    "pax_size_past_end": (_pax(record(b"size=999999999999999999")), "PAX size"),
    "gnu_long_name_empty": (extension(b"L", b"") + members(), "GNU long name"),
    "gnu_long_name_past_end": (extension(b"L", b"", size=10**9) + members(), "past the end"),
    "size_not_octal": (_first_header_with(_set(slice(124, 136), b"0000000002x\0")), "size field"),
    "size_negative": (_first_header_with(_set(slice(124, 136), b"-0000000002\0")), "size field"),
    "size_base256_negative": (
        _first_header_with(_set(slice(124, 136), b"\xff" * 12)),
        "size field",
    ),
    "checksum_mismatch": (_first_header_with(_flip, fix=False), "checksum"),
    "checksum_not_octal": (
        _first_header_with(_set(slice(148, 156), b"12345x\0 "), fix=False),
        "checksum",
    ),
    "truncated_header": (members()[:100], "truncated"),
    # a sparse member as GNU tar --format=posix -S and bsdtar write it: PAX 1.0 records, a
    # GNUSparseFile.N/ name in the header, the data a map then the extents (issue 20)
    "pax_sparse_1_0": (
        _pax(
            record(b"GNU.sparse.major=1"),
            record(b"GNU.sparse.minor=0"),
            record(f"GNU.sparse.name={KEY}.a".encode()),
            record(b"GNU.sparse.realsize=1048576"),
        ),
        f"member '{KEY}.a' is written as a sparse member .*--no-read-sparse",
    ),
    "pax_sparse_0_1": (  # the older PAX sparse form: no name record
        _pax(record(b"GNU.sparse.size=4096"), record(b"GNU.sparse.map=0,512")),
        "is written as a sparse member",
    ),
    "gnu_sparse": (  # tar --format=gnu -S: typeflag S
        _first_header_with(_set(slice(156, 157), b"S")),
        "is written as a sparse member",
    ),
    "gzip_stream": (_gzipped(members()), "gzip data \\(magic bytes 1f 8b\\)"),
}


def hostile_dataset(root: str, case: str) -> int:
    """Write a dataset of ``GOOD`` factory samples then the hostile sample of ``case`` in one
    shard (indexed, laid out, in the manifest) under ``root``; returns the hostile sample's
    byte offset in the shard."""
    buf = io.BytesIO()
    writer = TarStreamWriter(buf)
    for i in range(GOOD):
        writer.write_sample(f"train{i:07d}", sample_members(i, 0))
    idx, _ = writer.close()
    offsets = decode_index(idx)[:GOOD].tolist()
    good = buf.getvalue()[: -len(END_OF_ARCHIVE)]
    hostile, _ = CASES[case]
    at = len(good)
    data = good + hostile + (b"" if case == "truncated_header" else END_OF_ARCHIVE)
    end = at + len(hostile)
    os.makedirs(os.path.join(root, "train"), exist_ok=True)
    with open(os.path.join(root, SHARD), "wb") as f:
        f.write(data)
    with open(os.path.join(root, index_path(SHARD)), "wb") as f:
        f.write(encode_index([*offsets, at, end]))

    manifest = Manifest(schema=dict(SCHEMA), dims={"D": 4})
    manifest.splits["train"] = SplitInfo(
        shards=[
            ShardInfo(
                path=SHARD,
                idx_path=index_path(SHARD),
                num_samples=GOOD + 1,
                num_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                layout=writer.layout,
            )
        ]
    )
    manifest.save(root)
    return at
