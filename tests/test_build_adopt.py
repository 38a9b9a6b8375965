"""Adopting shards made elsewhere: webdataset's ShardWriter, GNU tar, tarfile's GNU format."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from build_shards.adopt import adopt
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest, decode_index, iter_members, padded, split_name

wds = pytest.importorskip("webdataset")


def write_wds(folder, prefix: str, n: int, maxcount: int) -> list[str]:
    """Shards written by webdataset's ShardWriter (PAX headers before every member)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = [f"{prefix}{i:05d}" for i in range(n)]
    with wds.ShardWriter(str(folder / "shard-%04d.tar"), maxcount=maxcount, verbose=0) as w:
        for i, key in enumerate(keys):
            w.write(
                {
                    "__key__": key,
                    "vec.npy": np.full(4, i, dtype=np.float32),
                    "txt": "x" * (1 + i % 7),
                    "cls": i,
                    "json": {"i": i},
                }
            )
    return keys


def tar_reference(path) -> tuple[list[int], list[str], int]:
    """Sample start offsets (header chain start of each sample's first member), keys and the end
    offset, as Python's tarfile sees them: an independent reader."""
    starts, keys, end = [], [], 0
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            key = split_name(m.name)[0]
            if not keys or keys[-1] != key:
                starts.append(m.offset)
                keys.append(key)
            end = m.offset_data + padded(m.size)
    return starts, keys, end


def file_state(root) -> dict[str, tuple[str, int]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".tar"):
                p = os.path.join(dirpath, name)
                with open(p, "rb") as f:
                    out[p] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def check_shard(root, shard) -> list[str]:
    """Check one ShardInfo against the file and tarfile; returns the keys in idx order."""
    data = (root / shard.path).read_bytes()
    assert shard.num_bytes == len(data)
    assert shard.sha256 == hashlib.sha256(data).hexdigest()
    offsets = decode_index((root / shard.idx_path).read_bytes())
    starts, keys, end = tar_reference(root / shard.path)
    assert offsets.tolist() == starts + [end]
    assert shard.num_samples == len(keys) == len(offsets) - 1
    for i, key in enumerate(keys):
        first = next(iter_members(data, int(offsets[i]), int(offsets[i + 1])))
        assert split_name(first.name)[0] == key
        # every member between two offsets belongs to that sample
        names = [m.name for m in iter_members(data, int(offsets[i]), int(offsets[i + 1]))]
        assert names and all(split_name(n)[0] == key for n in names)
    return keys


def test_adopt_webdataset_shardwriter_folders(tmp_path):
    root = tmp_path / "ds"
    train_keys = write_wds(root / "train", "tr", 25, maxcount=10)
    val_keys = write_wds(root / "val", "va", 7, maxcount=10)
    before = file_state(root)
    manifest = adopt(root)
    assert file_state(root) == before, "tars must stay byte-identical with the same mtime"
    loaded = Manifest.load(root)
    assert loaded.to_dict()["splits"] == manifest.to_dict()["splits"]
    assert list(loaded.splits) == ["train", "val"]
    assert [s.path for s in loaded.splits["train"].shards] == [
        f"train/shard-{i:04d}.tar" for i in range(3)
    ]
    assert [s.num_samples for s in loaded.splits["train"].shards] == [10, 10, 5]
    assert loaded.splits["val"].num_samples == 7
    got = [k for s in loaded.splits["train"].shards for k in check_shard(root, s)]
    assert got == train_keys
    assert [k for s in loaded.splits["val"].shards for k in check_shard(root, s)] == val_keys
    schema = {name: (f.ext, f.encoding, f.dtype, f.shape) for name, f in loaded.schema.items()}
    assert schema == {
        "vec": ("vec.npy", "npy", "float32", [4]),
        "txt": ("txt", "txt", "str", None),
        "cls": ("cls", "cls", "int", None),
        "json": ("json", "json", "json", None),
    }
    assert loaded.build["adopted"] is True


def test_layout_points_at_fixed_size_data(tmp_path):
    root = tmp_path / "ds"
    write_wds(root, "k", 12, maxcount=100)
    shard = adopt(root).splits["train"].shards[0]
    assert "vec.npy" in shard.layout
    off, size = shard.layout["vec.npy"]
    data = (root / shard.path).read_bytes()
    offsets = decode_index((root / shard.idx_path).read_bytes())
    for i in range(shard.num_samples):
        start = int(offsets[i]) + off
        arr = np.load(io.BytesIO(data[start : start + size]))
        assert arr.tolist() == [float(i)] * 4


def test_adopt_gnu_tar_ustar(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    names = []
    for i in range(6):
        (src / f"s{i:03d}.txt").write_text("t" * (i * 300))
        (src / f"s{i:03d}.seg.json").write_text(json.dumps({"i": i}))
        names += [f"s{i:03d}.seg.json", f"s{i:03d}.txt"]
    root = tmp_path / "ds"
    (root / "test").mkdir(parents=True)
    subprocess.run(
        ["tar", "--sort=name", "--format=ustar", "-cf", str(root / "test" / "x.tar"), "-C"]
        + [str(src)]
        + names,
        check=True,
    )
    before = file_state(root)
    manifest = adopt(root)
    assert file_state(root) == before
    (shard,) = manifest.splits["test"].shards
    assert check_shard(root, shard) == [f"s{i:03d}" for i in range(6)]
    assert shard.num_bytes % 10240 == 0  # GNU tar's record padding stays outside the samples
    assert manifest.schema["seg"].ext == "seg.json"


def test_adopt_tarfile_gnu_long_names(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    long_dir = "very/" + "deep_folder_name_" * 6
    keys = [f"{long_dir}/sample{i:03d}" for i in range(4)]
    assert len(keys[0]) > 100
    with tarfile.open(root / "long.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        for i, key in enumerate(keys):
            for ext, payload in (("txt", f"doc {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    manifest = adopt(root)
    (shard,) = manifest.splits["train"].shards
    assert check_shard(root, shard) == keys
    # the offset is the GNU long-name header, so a reader starting there sees the whole name
    data = (root / "long.tar").read_bytes()
    offsets = decode_index((root / shard.idx_path).read_bytes())
    assert data[int(offsets[1]) + 156 : int(offsets[1]) + 157] == b"L"


def test_split_pattern(tmp_path):
    root = tmp_path / "flat"
    for split, n in (("train", 5), ("val", 3), ("test", 2)):
        write_wds(root / "tmp", split, n, maxcount=100)
        shutil.move(root / "tmp" / "shard-0000.tar", root / f"{split}-000.tar")
    shutil.rmtree(root / "tmp")
    manifest = adopt(root, splits=r"(?P<split>train|val|test)-\d+\.tar")
    assert {k: v.num_samples for k, v in manifest.splits.items()} == {
        "train": 5,
        "val": 3,
        "test": 2,
    }
    assert list(manifest.splits) == ["train", "val", "test"]
    assert manifest.build["split_rule"].startswith("pattern ")
    (root / "other.tar").write_bytes((root / "test-000.tar").read_bytes())
    with pytest.raises(ValueError, match="other.tar.*does not match"):
        adopt(root, splits=r"(?P<split>train|val|test)-\d+\.tar", overwrite=True)
    with pytest.raises(ValueError, match="named group 'split'"):
        adopt(root, splits=r"(train|val)", overwrite=True)


def test_heterogeneous_samples(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    with wds.TarWriter(str(root / "mixed.tar")) as w:
        w.write({"__key__": "a0", "txt": "x", "cls": 0})
        w.write({"__key__": "a1", "txt": "y", "cls": 1})
        w.write({"__key__": "a2", "txt": "z"})
    with pytest.raises(ShardFormatError) as err:
        adopt(root)
    assert "mixed.tar" in str(err.value) and "'a2'" in str(err.value)
    assert not (root / "manifest.json").exists()
    assert not (root / ".mixed.tar.wdsidx").exists()
    manifest = adopt(root, strict=False)
    het = manifest.build["heterogeneous"]
    assert het["num_samples"] == 1
    assert het["examples"][0]["key"] == "a2"
    assert manifest.splits["train"].num_samples == 3


def test_varying_npy_shape_is_left_open(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    with wds.TarWriter(str(root / "v.tar")) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "tok.npy": np.arange(i + 1, dtype=np.int32)})
    spec = adopt(root).schema["tok"]
    assert (spec.dtype, spec.shape) == ("int32", None)


def test_errors_compressed_existing_empty(tmp_path):
    root = tmp_path / "ds"
    write_wds(root, "k", 3, maxcount=10)
    with wds.TarWriter(str(root / "z.tar.gz")) as w:
        w.write({"__key__": "z", "txt": "compressed"})
    with pytest.raises(ShardFormatError, match="compressed tars are not supported"):
        adopt(root)
    os.remove(root / "z.tar.gz")
    adopt(root)
    with pytest.raises(FileExistsError, match="manifest.json already exists"):
        adopt(root)
    assert adopt(root, overwrite=True).num_samples == 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        adopt(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        adopt(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "bad.tar").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(ShardFormatError, match="bad.tar"):
        adopt(tmp_path / "junk")


def test_workers_and_memory_filesystem(tmp_path):
    import fsspec

    root = tmp_path / "ds"
    write_wds(root / "train", "k", 30, maxcount=7)
    one = adopt(root).to_dict()
    two = adopt(root, overwrite=True, workers=2).to_dict()
    assert one["splits"] == two["splits"] and one["schema"] == two["schema"]

    fs = fsspec.filesystem("memory")
    for p in sorted((root / "train").glob("*.tar")):
        fs.pipe_file(f"/adopt-test/train/{p.name}", p.read_bytes())
    seen = []
    mem = adopt("memory://adopt-test", workers=2, progress=lambda d, t: seen.append((d, t)))
    assert mem.to_dict()["splits"] == one["splits"]
    assert seen[-1] == (5, 5)
    assert fs.exists("/adopt-test/train/.shard-0000.tar.wdsidx")
    assert Manifest.load("memory://adopt-test").num_samples == 30
    fs.rm("/adopt-test", recursive=True)


def test_adopting_our_own_build_reproduces_its_index_and_manifest(tmp_path):
    from build_shards.build import build_shards

    samples = [
        {"__key__": f"s{i:04d}", "vec": np.full(3, i, np.float32), "label": i % 4, "text": "ab" * i}
        for i in range(90)
    ]
    built = build_shards(
        samples, tmp_path / "ds", splits={"train": 0.7, "val": 0.3}, shard_max_count=16
    )
    idx = {p: p.read_bytes() for p in (tmp_path / "ds").rglob(".*.tar.wdsidx")}
    assert idx
    os.remove(tmp_path / "ds" / "manifest.json")
    for p in idx:
        os.remove(p)
    adopted = adopt(tmp_path / "ds")
    assert {p: p.read_bytes() for p in idx} == idx
    assert adopted.to_dict()["splits"] == built.to_dict()["splits"]
    assert adopted.schema == built.schema


# ------------------------------------------------------------------------------------------------
# hostile shards: sizes past the end, keys delivered twice
# ------------------------------------------------------------------------------------------------


def write_tar(path, members: list[tuple[str, bytes]], pax: dict[str, dict[str, str]] | None = None):
    """A PAX-format tar of ``(name, data)`` members; ``pax[name]`` adds PAX records to one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.pax_headers = dict((pax or {}).get(name, {}))
            tf.addfile(info, io.BytesIO(data))


def test_pax_size_past_the_end_of_the_file_is_refused(tmp_path):
    root = tmp_path / "ds"
    shard = root / "train" / "shard-0.tar"
    members = [("k0.txt", b"hello"), ("k1.txt", b"world"), ("k2.txt", b"again")]
    # tarfile writes our PAX record as given; then patch its digits in place (same length)
    write_tar(shard, members, pax={"k1.txt": {"size": "0000000000000000005"}})
    data = shard.read_bytes()
    at = data.index(b"size=0000000000000000005")
    patched = data[:at] + b"size=1000000000000000005" + data[at + 24 :]
    shard.write_bytes(patched)
    # the shared tar parser refuses it, naming the PAX header's offset
    pax_header = at // 512 * 512 - 512
    with pytest.raises(
        ShardFormatError,
        match=rf"ds/train/shard-0.tar at byte {pax_header}: PAX size \(1000000000000000005 bytes\) "
        "runs past the end",
    ):
        adopt(root)
    assert not (root / "manifest.json").exists()
    assert not (root / "train" / ".shard-0.tar.wdsidx").exists()


def test_key_twice_within_one_shard_is_refused(tmp_path):
    root = tmp_path / "ds"
    write_tar(root / "train" / "a.tar", [("k0.txt", b"x"), ("k1.txt", b"y"), ("k0.txt", b"z")])
    with pytest.raises(
        ShardFormatError,
        match=r"ds/train/a.tar: sample key 'k0' appears twice \(samples at bytes 0 and 2048\)",
    ):
        adopt(root)
    assert not (root / "manifest.json").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_key_in_two_shards_of_a_split_is_refused_naming_both(tmp_path, workers):
    root = tmp_path / "ds"
    write_tar(root / "train" / "a.tar", [(f"k{i}.txt", b"x") for i in range(50)])
    write_tar(root / "train" / "b.tar", [(f"k{i}.txt", b"y") for i in range(49, 60)])
    write_tar(root / "val" / "c.tar", [("k0.txt", b"v")])  # another split may share a key
    with pytest.raises(
        ShardFormatError,
        match=r"ds/train/a.tar and .*ds/train/b.tar both hold sample 'k49' \(split 'train'\)",
    ):
        adopt(root, workers=workers)
    assert not (root / "manifest.json").exists()
    (root / "train" / "b.tar").unlink()
    manifest = adopt(root)
    assert manifest.splits["train"].num_samples == 50
    assert manifest.splits["val"].num_samples == 1
