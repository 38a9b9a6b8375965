"""JSONL and text files read by item range (what Ray tasks read): exactly the items, numbering and
raw values of the sequential read, for any range, with checkpoints or without (compressed)."""

from __future__ import annotations

import gzip
import pickle
import random

import pytest

from build_shards import BuildError
from build_shards.sources import JsonlSource, TextSource
from build_shards.sources.ranged import RangedFileSource, scan_file

pytestmark = pytest.mark.slow  # a Ray cluster


def _jsonl_files(folder, rng):
    paths = []
    for k in range(3):
        p = folder / f"f{k}.jsonl"
        with open(p, "wb") as f:
            for i in rng.choices(range(5), k=150):
                f.write(b"\n" if i == 0 else b'{"a": %d}\r\n' % i if i == 1 else b'{"b": %d}\n' % i)
        paths.append(str(p))
    gz = folder / "g.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b'{"z": 1}\n\n  \n{"z": 2}\n{"z": 3}')  # no newline at the end
    paths.insert(1, str(gz))
    (folder / "empty.jsonl").write_bytes(b"\n\n")
    paths.append(str(folder / "empty.jsonl"))
    return paths


def _text_files(folder, rng):
    paths = []
    for k in range(2):
        p = folder / f"t{k}.txt"
        lines = rng.choices(["a line", "", "  ", "\u00a0", "more text \u00e9", "x\r"], k=250)
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(str(p))
    return paths


@pytest.mark.parametrize("kind", ["jsonl", "text"])
def test_every_range_reads_what_the_sequential_source_reads(tmp_path, kind):
    rng = random.Random(0)
    if kind == "jsonl":
        files, cls = _jsonl_files(tmp_path, rng), JsonlSource
    else:
        files, cls = _text_files(tmp_path, rng), TextSource
    ref = list(cls(files).iter_range(0, None))
    assert len(ref) > 100
    for every in (1, 3, 4096):
        scans = [scan_file(kind, p, every) for p in files]
        src = pickle.loads(pickle.dumps(RangedFileSource(cls(files), scans)))
        assert src.length == len(ref) and src.kind == kind and src.indexable
        assert src.describe() == cls(files).describe()  # the same resume fingerprint
        assert list(src.iter_range(0, None)) == ref
        for _ in range(150):
            a = rng.randrange(len(ref))
            b = rng.randrange(a, len(ref) + 1)
            assert list(src.iter_range(a, b)) == ref[a:b], (every, a, b)


def test_checkpoints_are_seekable_offsets_except_in_compressed_files(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"".join(b'{"i": %d}\n\n' % i for i in range(10)))
    scan = scan_file("jsonl", str(p), every=4)
    assert scan.count == 10
    assert scan.checkpoints == ((0, 0, 1), (4, 4 * 10, 9), (8, 8 * 10, 17))
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert scan_file("jsonl", str(gz), every=4).checkpoints == ((0, 0, 1),)


def test_a_text_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine\n\n\xff\xfe broken\n")
    with pytest.raises(BuildError, match=r"bad\.txt:3: not UTF-8"):
        scan_file("text", str(p))
