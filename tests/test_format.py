"""The on-disk contract: ustar members, index, manifest; real readers agree with ours."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from wdsloader.errors import ManifestError, ShardFormatError
from wdsloader.format import (
    Manifest,
    TarStreamWriter,
    decode_index,
    encode_member,
    iter_members,
    scan_tar,
    split_name,
    validate_key,
)


def test_split_name_follows_webdataset_rule():
    assert split_name("abc.question_emb.npy") == ("abc", "question_emb.npy")
    assert split_name("dir.v1/b.SEG.PNG") == ("dir.v1/b", "seg.png")
    assert split_name("noext") is None
    assert split_name(".hidden.txt") is None
    # metadata is only what webdataset's tar_file_iterator skips: "__NAME__" and "__NAME__/..."
    for meta in ("__meta__", "__x.y__", "__info__/x.txt", "__a__/b/c.txt"):
        assert split_name(meta) is None, meta
    assert split_name("__a.txt") == ("__a", "txt")  # a key led by "__" (a base64url hash...)
    assert split_name("__key__.txt") == ("__key__", "txt")
    assert split_name("d/__x__.txt") == ("d/__x__", "txt")


@pytest.mark.parametrize("bad", ["", "a.b", "_x", ".x", "a/b", "k" * 81])
def test_validate_key_rejects(bad):
    with pytest.raises(ValueError):
        validate_key(bad)


def test_writer_output_is_read_by_tarfile_and_gnu_tar(tmp_path):
    buf = io.BytesIO()
    w = TarStreamWriter(buf)
    w.write_sample("a0", [("x.txt", b"hello"), ("y.json", b"{}")])
    w.write_sample("a1", [("x.txt", b"hi"), ("y.json", b"[1]")])
    idx, sha = w.close()
    data = buf.getvalue()
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == ["a0.x.txt", "a0.y.json", "a1.x.txt", "a1.y.json"]
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
        assert tf.extractfile("a1.y.json").read() == b"[1]"
        assert all(m.pax_headers == {} for m in members)
    listing = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == ["a0.x.txt", "a0.y.json", "a1.x.txt", "a1.y.json"]
    offsets = decode_index(idx)
    assert offsets.tolist() == [0, 2048, 4096]
    assert len(data) == 4096 + 1024
    scanned, keys = scan_tar(data)
    assert scanned.tolist() == offsets.tolist() and keys == ["a0", "a1"]


def test_layout_records_constant_offsets_only():
    buf = io.BytesIO()
    w = TarStreamWriter(buf)
    w.write_sample("k0", [("v.npy", b"x" * 100), ("t.txt", b"ab")])
    w.write_sample("k1", [("v.npy", b"y" * 100), ("t.txt", b"abc")])
    w.close()
    assert w.layout == {"v.npy": [512, 100]}  # t.txt changes size, so it has no fixed layout


def test_iter_members_reads_pax_and_gnu_long_names():
    long = "d/" + "k" * 120 + ".txt"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            info = tarfile.TarInfo(long)
            info.size = 3
            tf.addfile(info, io.BytesIO(b"abc"))
        members = list(iter_members(buf.getvalue()))
        assert [m.name for m in members] == [long]
        raw = buf.getvalue()
        m = members[0]
        assert raw[m.data_offset : m.data_offset + m.size] == b"abc"


def test_corrupt_and_truncated_headers_name_the_offset():
    data = encode_member("a.txt", b"x" * 600) + encode_member("b.txt", b"y")
    bad = bytearray(data)
    bad[1536 + 10] ^= 0xFF  # second header, name field
    with pytest.raises(ShardFormatError, match="shard-x at byte 1536.*checksum"):
        list(iter_members(bytes(bad), source="shard-x"))
    with pytest.raises(ShardFormatError, match="truncated"):
        list(iter_members(data[:700], source="shard-x"))


def test_manifest_round_trip_and_version_gate(tmp_path):
    m = write_dataset(str(tmp_path / "ds"), {"train": [3, 2], "val": [1]})
    loaded = Manifest.load(str(tmp_path / "ds"))
    assert loaded.to_dict() == m.to_dict()
    assert loaded.split("train").num_samples == 5
    raw = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert "/" not in raw["splits"]["train"]["shards"][0]["path"][:1]
    raw["version"] = "3.0"
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="newer than this wdsloader"):
        Manifest.load(str(tmp_path / "ds"))
    with pytest.raises(ManifestError, match="manifest not found"):
        Manifest.load(str(tmp_path / "missing"))
    with pytest.raises(ManifestError, match="split 'nope'"):
        m.split("nope")


def test_manifest_refuses_absolute_shard_paths(tmp_path):
    m = write_dataset(str(tmp_path / "ds"), {"train": [1]})
    m.splits["train"].shards[0].path = "/etc/passwd"
    with pytest.raises(ManifestError, match="must be relative"):
        Manifest.from_dict(m.to_dict())


def test_webdataset_reads_factory_shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    write_dataset(str(tmp_path / "ds"), {"train": [4, 3]})
    urls = [str(tmp_path / "ds" / "train" / f"shard-{i:06d}.tar") for i in range(2)]
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert [int(s["idx.cls"]) for s in samples] == list(range(7))
    assert np.array_equal(samples[5]["vec.npy"], np.arange(50, 54, dtype=np.float32))


def test_scan_tar_starts_samples_at_their_extension_headers():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in ("a.txt", "ä1.txt", "ä1.json"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tf:
        expected = [m.offset for m in tf.getmembers()][:2]
    offsets, keys = scan_tar(buf.getvalue())
    assert keys == ["a", "ä1"] and offsets[:2].tolist() == expected


def test_ustar_fields_scalar_and_batch_parsers_agree():
    """format.ustar names the header fields; the scalar and whole-batch parsers read them alike."""
    import numpy as np

    from wdsloader.format import encode_header, ustar

    header = encode_header("k1.label.cls", 9)
    assert ustar.parse_octal(header[ustar.SIZE]) == 9
    assert header[ustar.MAGIC] == b"ustar\0" and header[ustar.TYPEFLAG] == b"0"
    assert ustar.member_name(header) == "k1.label.cls"
    assert ustar.plain_member(header) == ("k1.label.cls", 9)
    prefixed = bytearray(header)
    prefixed[ustar.PREFIX.start : ustar.PREFIX.start + 3] = b"dir"
    prefixed[ustar.CHECKSUM] = b"%06o\0 " % (sum(prefixed) - sum(prefixed[ustar.CHECKSUM]) + 256)
    assert ustar.checksum_ok(prefixed) and ustar.member_name(prefixed) == "dir/k1.label.cls"
    assert ustar.plain_member(bytes(prefixed)) is None  # a prefix: the general parser's
    corrupt = header[:5] + b"X" + header[6:]
    assert not ustar.checksum_ok(corrupt) and ustar.plain_member(corrupt) is None
    rows = np.frombuffer(header + bytes(prefixed) + corrupt, np.uint8).reshape(3, ustar.BLOCK)
    assert ustar.checksums_ok(rows).tolist() == [True, True, False]
    assert ustar.header_sizes(rows).tolist() == [9, 9, 9]
    assert ustar.typeflags(rows).tolist() == [0x30] * 3
    assert ustar.plain_regular(rows[:1]) and not ustar.plain_regular(rows[:2])
    assert bytes(ustar.name_fields(rows)[0]).rstrip(b"\0") == b"k1.label.cls"


def test_octal_sizes_accepts_octal_digits_only():
    """Every byte but ``0``-``7`` in a digit place refuses the batch (those below ``0``
    included), as does a last byte other than NUL or space."""
    from wdsloader.format import ustar

    good = np.frombuffer(b"00000001750\0" + b"00000000011 ", np.uint8).reshape(2, 12)
    assert ustar.octal_sizes(good).tolist() == [0o1750, 9]
    for bad in (*range(0, 48), 56, 57, 65, 255):
        field = good.copy()
        field[1, 4] = bad
        assert ustar.octal_sizes(field) is None, bad
    for last in (ord("0"), ord("\n"), 255):
        field = good.copy()
        field[0, 11] = last
        assert ustar.octal_sizes(field) is None, last
