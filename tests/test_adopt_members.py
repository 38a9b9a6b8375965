"""Which tar members ``adopt`` takes as sample members, skips (and says so) or refuses (naming
the shard and member): keys led by ``__``, metadata names, object arrays, links, sparse members,
and what the loader then reads."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from build_shards.adopt import adopt
from build_shards.cli import main as build_cli
from wdsloader import create_loader
from wdsloader.decode import parse_sample
from wdsloader.errors import ShardFormatError

wds = pytest.importorskip("webdataset")


def write_tar(path, members: list[tuple[str, bytes]]) -> None:
    """A PAX tar of regular members ``(name, data)``, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def loader_keys(root) -> list[str]:
    loader = create_loader(str(root), "train", batch_size=2, shuffle=False, drop_last=False)
    return [k for batch in loader for k in batch["__key__"]]


def webdataset_keys(path) -> list[str]:
    return [s["__key__"] for s in wds.WebDataset(str(path), shardshuffle=False)]


# -- keys led by "__" and metadata names ----------------------------------------------------------
_UNDERSCORE_MEMBERS = [
    ("__a.txt", b"a"),
    ("__meta__", b"webdataset metadata: no sample"),
    ("b.txt", b"b"),
    ("__x.y__", b"metadata again"),
    ("__c__d.txt", b"c"),
    ("__info__/x.txt", b"a metadata folder"),
    ("_-Zk9__.txt", b"d"),  # a base64url hash may start or end with "_"
    (".hidden.txt", b"hidden"),
]


def test_keys_led_by_two_underscores_are_samples_as_webdataset_reads_them(tmp_path):
    shard = tmp_path / "ds" / "s.tar"
    write_tar(shard, _UNDERSCORE_MEMBERS)
    expected = webdataset_keys(shard)
    assert expected == ["__a", "b", "__c__d", "_-Zk9__"]
    manifest = adopt(tmp_path / "ds")
    assert manifest.num_samples == 4
    assert loader_keys(tmp_path / "ds") == expected
    skipped = manifest.build["skipped_members"]
    assert skipped["num_members"] == 4
    assert [(e["shard"], e["member"], e["why"]) for e in skipped["examples"]] == [
        ("s.tar", "__meta__", "a metadata name (__NAME__), which webdataset skips too"),
        ("s.tar", "__x.y__", "a metadata name (__NAME__), which webdataset skips too"),
        ("s.tar", "__info__/x.txt", "a metadata name (__NAME__), which webdataset skips too"),
        ("s.tar", ".hidden.txt", "a hidden name (starts with '.')"),
    ]


def test_the_adopt_summary_says_what_was_skipped_and_why(tmp_path, capsys):
    write_tar(tmp_path / "ds" / "s.tar", [("k.txt", b"k"), ("README", b"no extension")])
    assert build_cli(["adopt", str(tmp_path / "ds"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 tar members are no sample member, skipped:" in out
    assert "  s.tar: 'README': no extension (a sample member is named KEY.EXT)" in out


def test_nothing_skipped_records_nothing(tmp_path):
    write_tar(tmp_path / "ds" / "s.tar", [("k.txt", b"k")])
    assert "skipped_members" not in adopt(tmp_path / "ds").build


# -- object arrays --------------------------------------------------------------------------------
def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def test_object_arrays_are_refused_at_adopt_naming_shard_and_member(tmp_path):
    """A manifest declaring dtype object is refused by the loader: adopt refuses first, naming
    the member, and writes nothing."""
    numbers = _npy(np.arange(3, dtype=np.int64))
    objects = _npy(np.array([{"a": 1}, None], dtype=object))
    write_tar(
        tmp_path / "ds" / "train" / "s.tar",
        [("k0.vec.npy", numbers), ("k1.vec.npy", objects), ("k2.vec.npy", numbers)],
    )
    with pytest.raises(ShardFormatError) as err:
        adopt(tmp_path / "ds")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'ds'}/train/s.tar: member 'k1.vec.npy' is an .npy")
    assert "dtype object" in message and "object arrays are pickles" in message
    assert "allow_pickle=True" in message
    assert sorted(p.name for p in (tmp_path / "ds" / "train").iterdir()) == ["s.tar"]
    assert not (tmp_path / "ds" / "manifest.json").exists()


# -- links -----------------------------------------------------------------------------------------
def test_links_are_refused_at_adopt_naming_the_member(tmp_path):
    """GNU tar stores a second name of a file as a hard link, and a symlink as a link: readers
    skip both, so the field would vanish. A link outside the samples ("latest") is harmless."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"k{i}.cls").write_text(str(i))
    (src / "k0.txt").write_text("zero")
    os.link(src / "k0.txt", src / "k1.txt")
    os.symlink("k0.txt", src / "k2.txt")
    os.symlink("k0.txt", src / "latest")
    names = ["k0.cls", "k0.txt", "k1.cls", "k1.txt", "k2.cls", "k2.txt", "latest"]
    (tmp_path / "ds").mkdir()
    shard = tmp_path / "ds" / "s.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(shard), *names], cwd=src, check=True)
    with pytest.raises(ShardFormatError) as err:
        adopt(tmp_path / "ds")
    assert re.match(
        rf"{re.escape(str(shard))} at byte \d+: member 'k1.txt' is a hard link \(to 'k0.txt'\); "
        "WebDataset samples need regular files",
        str(err.value),
    )
    names.remove("k1.txt")
    subprocess.run(["tar", "--format=gnu", "-cf", str(shard), *names], cwd=src, check=True)
    with pytest.raises(ShardFormatError, match=r"member 'k2.txt' is a symlink \(to 'k0.txt'\)"):
        adopt(tmp_path / "ds")
    names = ["k0.cls", "k0.txt", "latest"]
    subprocess.run(["tar", "--format=gnu", "-cf", str(shard), *names], cwd=src, check=True)
    assert adopt(tmp_path / "ds").num_samples == 1  # "latest" is no sample member: left alone


# -- sparse members --------------------------------------------------------------------------------
def _file_with_holes(path) -> None:
    """1 MiB of which only the first 4 KiB and the last 100 bytes are written."""
    with open(path, "wb") as f:
        f.truncate(1 << 20)
        f.write(b"A" * 4096)
        f.seek((1 << 20) - 100)
        f.write(b"B" * 100)


_SPARSE_TOOLS = {
    "gnu_tar_posix": ["tar", "--format=posix", "-S", "-cf"],
    "gnu_tar_gnu": ["tar", "--format=gnu", "-S", "-cf"],
    "bsdtar": ["bsdtar", "-cf"],  # bsdtar writes files with holes as sparse by default
}


@pytest.mark.parametrize("tool", _SPARSE_TOOLS)
def test_sparse_members_are_refused_at_adopt_and_at_read(tmp_path, tool):
    """A file with holes tarred by GNU tar -S or bsdtar is a sparse member: its data in the tar
    are a map and the compacted extents. Refused, naming shard, member and the way out."""
    command = _SPARSE_TOOLS[tool]
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed")
    src = tmp_path / "src"
    src.mkdir()
    (src / "0000.txt").write_text("hello")
    _file_with_holes(src / "0000.bin")
    (tmp_path / "ds").mkdir()
    shard = tmp_path / "ds" / "s.tar"
    subprocess.run([*command, str(shard), "0000.txt", "0000.bin"], cwd=src, check=True)
    with tarfile.open(shard) as tf:  # a sparse member indeed (tarfile expands it)
        member = tf.getmember("0000.bin")
        assert member.issparse() and tf.extractfile(member).read()[-100:] == b"B" * 100
    expected = (
        rf"^{re.escape(str(shard))} at byte \d+: member '0000.bin' is written as a sparse "
        r"member \(GNU tar -S/--sparse, bsdtar\).* re-create the tar without --sparse "
        r"\(bsdtar: --no-read-sparse\)$"
    )
    with pytest.raises(ShardFormatError, match=expected):
        adopt(tmp_path / "ds")
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["s.tar"]
    data = shard.read_bytes()  # the read side parses sample ranges with the same walk
    with pytest.raises(ShardFormatError, match=expected):
        parse_sample(data, 0, len(data) - 1024, source=str(shard))


def test_a_gzip_stream_named_tar_is_called_gzip(tmp_path):
    (tmp_path / "ds").mkdir()
    with tarfile.open(tmp_path / "ds" / "s.tar", "w:gz") as tf:
        info = tarfile.TarInfo("k.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(ShardFormatError) as err:
        adopt(tmp_path / "ds")
    assert str(err.value) == (
        f"{tmp_path / 'ds' / 's.tar'} at byte 0: gzip data (magic bytes 1f 8b), not a tar "
        "header: a gzip-compressed tar named .tar? decompress it first (gzip -dc)"
    )
