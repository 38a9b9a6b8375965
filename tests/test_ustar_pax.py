"""The tar member walk (:func:`wdsloader.format.iter_members`) against Python's ``tarfile`` on
random archives (names short, long, non-ASCII or split into a ustar prefix; PAX records; GNU
long names; links and directories between the members), and against the walk as it was before
its fast path (:mod:`tests.ustar_reference`) on random corruptions of those archives and on
random PAX record data: on every input both yield the same members, then the same error (class
and message)."""

from __future__ import annotations

import io
import mmap
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.dataset_factory import sample_members
from tests.hostile_tar import (
    CASES,
    END_OF_ARCHIVE,
    GOOD,
    extension,
    header,
    members,
    record,
    with_checksum,
)
from tests.ustar_reference import reference_members
from wdsloader.errors import ShardFormatError
from wdsloader.format import BLOCK, iter_members

FAST = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
_SEGMENT = st.text(alphabet="abcz09_-.äé", min_size=1, max_size=60).filter(
    lambda s: s not in (".", "..")
)
_NAMES = st.lists(_SEGMENT, min_size=1, max_size=3).map("/".join)
_PAX_EXTRA = st.dictionaries(
    st.sampled_from(["comment", "mtime", "atime", "uname", "path", "size", "x.y"]),
    st.text(alphabet="az09. =\n", min_size=0, max_size=30),
    max_size=3,
)


@st.composite
def archives(draw) -> tuple[bytes, int]:
    """A tar written by ``tarfile`` (format drawn), and its format."""
    fmt = draw(st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for _ in range(draw(st.integers(1, 6))):
            info = tarfile.TarInfo(draw(_NAMES))
            kind = draw(st.sampled_from(["file"] * 6 + ["dir", "symlink"]))
            data = b""
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, draw(_NAMES)
            else:
                data = draw(st.binary(max_size=1500))
                info.size = len(data)
            info.mtime = draw(st.sampled_from([0, 1_700_000_000, 1_700_000_000.25]))
            if fmt == tarfile.PAX_FORMAT:
                extra = draw(_PAX_EXTRA)
                if "size" in extra:  # a PAX size that agrees with the data
                    extra["size"] = str(info.size)
                info.pax_headers = extra
            try:
                tf.addfile(info, io.BytesIO(data) if kind == "file" else None)
            except ValueError:  # a name USTAR cannot hold
                pass
    return buf.getvalue(), fmt


def _tarfile_members(data: bytes) -> list[tuple[str, int, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tf if m.isreg()]


def _tarfile_data(data: bytes) -> list[bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return [tf.extractfile(m).read() for m in tf.getmembers() if m.isreg()]


def _outcome(walk, *args, **kwargs) -> tuple[list[tuple[str, int, int, int]], object]:
    """What a walk yields before it ends, and how it ends (None or the error)."""
    got: list[tuple[str, int, int, int]] = []
    try:
        for m in walk(*args, **kwargs):
            got.append(tuple(m))
    except ShardFormatError as exc:
        return got, (type(exc), str(exc))
    return got, None


@FAST
@given(archives())
def test_members_agree_with_tarfile(archive):
    data, _ = archive
    expected = _tarfile_members(data)
    got = list(iter_members(data))
    assert [tuple(m) for m in got] == expected
    assert [data[m.data_offset : m.data_offset + m.size] for m in got] == _tarfile_data(data)
    assert _outcome(reference_members, data) == (expected, None)


@FAST
@given(archives(), st.data())
def test_corrupt_archives_fail_as_before(archive, draw):
    """Random byte changes in the headers (checksum refreshed or not), truncations and sample
    ranges: the same members, then the same error as the reference walk."""
    data, _ = archive
    raw = bytearray(data)
    headers = [
        i for i in range(0, len(raw) - BLOCK + 1, BLOCK) if raw[i + 257 : i + 262] == b"ustar"
    ]
    for _ in range(draw.draw(st.integers(1, 3)) if headers else 0):
        at = draw.draw(st.sampled_from(headers))
        field = draw.draw(
            st.sampled_from([0, 99, 124, 130, 134, 135, 148, 153, 154, 155, 156, 257, 345, 511])
        )
        raw[at + field] = draw.draw(
            st.sampled_from([0, 0x20, 0x30, 0x37, 0x38, 0x2B, 0x78, 0x4C, 0x80, 0xFF])
        )
        if draw.draw(st.booleans()):
            raw[at : at + BLOCK] = with_checksum(raw[at : at + BLOCK])
    cut = draw.draw(st.sampled_from([len(raw), len(raw) - 1024, len(raw) // 2, 700]))
    hostile = bytes(raw[: max(cut, 0)])
    start = draw.draw(st.sampled_from([0, 0, BLOCK]))
    end = draw.draw(st.sampled_from([None, len(hostile) - 1024, len(hostile) // BLOCK * 256]))
    kw = {"base_offset": 3000, "source": "s.tar"}
    expected = _outcome(reference_members, hostile, start, end, **kw)
    assert _outcome(iter_members, hostile, start, end, **kw) == expected
    array = np.frombuffer(hostile, dtype=np.uint8).copy()
    assert _outcome(iter_members, memoryview(array), start, end, **kw) == expected


_RECORD_KEYS = [b"path", b"size", b"mtime", b"comment", b"", b"\xff\xfe", b"p=q", b"k\0"]


@st.composite
def pax_data(draw) -> bytes:
    """PAX record data: records of drawn keys and values whose length is right or off."""
    out = b""
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(_RECORD_KEYS))
        value = draw(st.sampled_from([b"", b"12", b"k.txt", b"x/y.json", b"-1", b"9" * 30]))
        body = key + (b"" if draw(st.integers(0, 9)) == 0 else b"=") + value + b"\n"
        n = len(body) + 2
        n += len(str(n)) - 1
        n += draw(st.sampled_from([0, 0, 0, -1, 1, -len(body), 50]))
        length = draw(st.sampled_from([b"%d" % n, b"%d" % n, b"x", b"", b"+%d" % n, b"0"]))
        out += length + draw(st.sampled_from([b" ", b" ", b"\t"])) + body
    return out + b"\0" * draw(st.sampled_from([0, 0, 3]))


@FAST
@given(pax_data())
def test_pax_records_decide_as_before(data):
    """Any PAX record data before a member: the same name and size, or the same error."""
    sample = extension(b"x", data) + members() + END_OF_ARCHIVE
    kw = {"base_offset": 100, "source": "s.tar"}
    assert _outcome(iter_members, sample, **kw) == _outcome(reference_members, sample, **kw)


@pytest.mark.parametrize("case", CASES)
def test_hostile_cases_give_the_same_message(case):
    data = CASES[case][0] + (b"" if case == "truncated_header" else END_OF_ARCHIVE)
    kw = {"base_offset": 512, "source": "shard-000007.tar"}
    new = _outcome(iter_members, data, **kw)
    assert new == _outcome(reference_members, data, **kw)
    assert new[1] is not None and new[1][0] is ShardFormatError


def _high_header(name: str, size: int) -> bytearray:
    """A header whose byte sum exceeds 65521: 0xFF in every field no reader parses (after the
    name's NUL, mode to mtime, link name, user/group names, device numbers, the padding)."""
    h = bytearray(header(name, size))
    for field in (slice(len(name) + 1, 100), slice(100, 124), slice(136, 148)):
        h[field] = b"\xff" * (field.stop - field.start)
    for field in (slice(157, 257), slice(265, 345), slice(500, 512)):
        h[field] = b"\xff" * (field.stop - field.start)
    return h


def test_checksum_off_by_65521_is_refused():
    """Adler-32 sums modulo 65521: a header whose stored checksum is its byte sum minus 65521
    must still be refused (the fast path must not accept it)."""
    h = _high_header("k.txt", 2)
    h[148:156] = b" " * 8
    total = sum(h)
    assert total > 65521
    h[148:156] = b"%06o\0 " % (total - 65521)
    data = bytes(h) + b"ab".ljust(BLOCK, b"\0") + END_OF_ARCHIVE
    with pytest.raises(ShardFormatError, match=r"^s\.tar at byte 0: corrupt tar header"):
        list(iter_members(data, source="s.tar"))
    h[148:156] = b"%06o\0 " % total
    data = bytes(h) + b"ab".ljust(BLOCK, b"\0") + END_OF_ARCHIVE
    assert [tuple(m) for m in iter_members(data)] == [("k.txt", 0, 512, 2)]


def test_signed_checksums_and_other_field_forms_are_read():
    """Old writers' signed byte sums, 7-digit checksums, space-ended and base-256 sizes."""
    h = _high_header("k.txt", 2)
    h[124:136] = b"00000000002 "
    h[148:156] = b" " * 8
    signed = sum(h) - 256 * sum(1 for b in h if b >= 0x80)
    h[148:156] = b"%07o\0" % signed
    base256 = bytearray(header("b.txt", 0))
    base256[124:136] = b"\x80" + (2).to_bytes(11, "big")
    body = b"ab".ljust(BLOCK, b"\0")
    data = bytes(h) + body + with_checksum(base256) + body + END_OF_ARCHIVE
    got = [tuple(m) for m in iter_members(data)]
    assert got == [("k.txt", 0, 512, 2), ("b.txt", 1024, 1536, 2)]
    assert got == _outcome(reference_members, data)[0]


def test_buffers_of_every_kind_give_the_same_members(tmp_path):
    """bytes, an mmap, a memoryview of either, a part of a buffer and a numpy buffer."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(4):
            info = tarfile.TarInfo(f"{i:04d}.{'é' * i}txt")
            info.size, info.mtime = i * 100, 1_700_000_000.5
            tf.addfile(info, io.BytesIO(b"z" * info.size))
    data = buf.getvalue()
    expected = _tarfile_members(data)
    assert len(expected) == 4
    path = tmp_path / "a.tar"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        assert [tuple(m) for m in iter_members(mm)] == expected
        assert [tuple(m) for m in iter_members(view)] == expected
        view.release()
    padded_data = b"\1" * BLOCK + data
    shifted = [(n, a + BLOCK, d + BLOCK, s) for n, a, d, s in expected]
    assert [tuple(m) for m in iter_members(memoryview(padded_data), BLOCK)] == shifted
    part = memoryview(padded_data)[BLOCK:]  # a view of a part: offsets count from the part
    assert [tuple(m) for m in iter_members(part)] == expected
    assert [tuple(m) for m in iter_members(bytearray(data))] == expected
    assert [tuple(m) for m in iter_members(np.frombuffer(data, np.uint8))] == expected


def test_a_record_without_a_length_is_refused_where_it_starts():
    """After a value ending in a newline, a record with no length is malformed at its own byte
    (the walk before the fast path stepped back a byte and failed at an earlier one); NUL
    padding in the same place is allowed."""
    first = record(b"comment=x\n")
    sample = extension(b"x", first + b"path=evil\n") + members() + END_OF_ARCHIVE
    at = rf"^s\.tar at byte 0: malformed PAX record at byte {len(first)} of the extended header"
    with pytest.raises(ShardFormatError, match=at + r": length b'' does not frame"):
        list(iter_members(sample, source="s.tar"))
    fine = extension(b"x", first + b"\0\0\0") + members() + END_OF_ARCHIVE
    names = [m.name for m in iter_members(fine)]
    assert names == [name for name, *_ in iter_members(members() + END_OF_ARCHIVE)]
    assert len(names) == len(list(sample_members(GOOD, 0)))


def test_usual_headers_take_the_fast_path(monkeypatch):
    """Headers as our writer and tarfile (webdataset's ShardWriter) write them never reach the
    general checks: only the end-of-archive marker does (the walk's speed depends on it)."""
    from wdsloader.format import members as walk

    general: list[int] = []

    def counted(header: bytes, source: str, at: int) -> int:
        general.append(at)
        return checked(header, source, at)

    checked = walk._checked_size
    monkeypatch.setattr(walk, "_checked_size", counted)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(20):
            info = tarfile.TarInfo(f"{i:06d}.{'json' if i % 2 else 'npy'}")
            info.size, info.mtime = 3 * i, 1_700_000_000.25 + i  # a PAX header before each
            tf.addfile(info, io.BytesIO(b"x" * info.size))
    for data in (buf.getvalue(), members() + END_OF_ARCHIVE):
        general.clear()
        got = list(iter_members(data))
        assert len(got) in (20, len(list(sample_members(GOOD, 0))))
        assert general == [got[-1].data_offset + (got[-1].size + BLOCK - 1) // BLOCK * BLOCK]
