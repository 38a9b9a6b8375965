"""Each sample's length of a declared field, recorded beside its shard
(``samples=SampleOptions(lengths=...)``, wdsloader.format.lengths): exact for every sample after
blocks and packed remainders, the shards' bytes unchanged, clear errors naming the shard."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pytest

from build_shards import BuildError, SampleOptions, ShardOptions, build_shards
from build_shards.commit.card import CARD_MARK
from wdsloader.errors import ShardFormatError
from wdsloader.format import Manifest
from wdsloader.format.lengths import read_lengths, read_split_lengths, sample_length

FS = fsspec.filesystem("file")


def _length(i: int) -> int:
    return (i * 37) % 29 + (i % 3) * 100  # 0 .. 228, some zero


def _samples(n: int) -> list[dict]:
    return [
        {"__key__": f"s{i:05d}", "input_ids": np.arange(_length(i), dtype=np.int32), "i": i}
        for i in range(n)
    ]


OPTS = dict(
    splits={"train": 0.8, "val": 0.2},
    shards=ShardOptions(max_count=16, block_size=50),
)


def _keys_in_order(path: Path) -> list[str]:
    with tarfile.open(path, "r:*") as tar:
        keys = [m.name.split(".", 1)[0] for m in tar.getmembers()]
    return list(dict.fromkeys(keys))


@pytest.mark.parametrize(
    ("compression", "workers"), [(None, 1), ("gzip", 1), (None, 2)], ids=["tar", "gzip", "workers"]
)
def test_lengths_are_each_samples_after_blocks_and_packed_remainders(
    tmp_path, compression, workers
):
    out = tmp_path / "ds"
    opts = dict(OPTS, shards=ShardOptions(max_count=16, block_size=50, compression=compression))
    lengths_opt = SampleOptions(lengths="input_ids")
    build_shards(_samples(300), out, samples=lengths_opt, workers=workers, **opts)
    manifest = Manifest.load(str(out))
    assert manifest.build["lengths_field"] == "input_ids"
    expected = {f"s{i:05d}": _length(i) for i in range(300)}
    seen, mixed = 0, 0
    for name, split in manifest.splits.items():
        assert len(split.shards) > 2, name
        for shard in split.shards:
            assert shard.lengths_path == shard.path.replace(f"{name}/", f"{name}/.") + ".wdslen"
            lengths = read_lengths(FS, str(out), shard)
            assert lengths.dtype == np.uint32
            keys = _keys_in_order(out / shard.path)
            assert lengths.tolist() == [expected[k] for k in keys], shard.path
            seen += len(keys)
            mixed += len({int(k[1:]) // 50 for k in keys}) > 1  # packed from blocks' remainders
    assert seen == 300
    assert mixed >= 4
    train = manifest.split("train").shards
    by_id = read_split_lengths(FS, str(out), train)
    keys = [k for shard in train for k in _keys_in_order(out / shard.path)]
    assert by_id.tolist() == [expected[k] for k in keys]
    assert read_split_lengths(FS, str(out), []).tolist() == []


def test_recording_lengths_leaves_the_shards_and_indexes_unchanged(tmp_path):
    plain, with_lengths = tmp_path / "plain", tmp_path / "lengths"
    build_shards(_samples(300), plain, **OPTS)
    build_shards(_samples(300), with_lengths, samples=SampleOptions(lengths="input_ids"), **OPTS)

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and p.parent != root
        }

    a, b = files(plain), files(with_lengths)
    extra = sorted(set(b) - set(a))
    assert extra and all(p.endswith(".wdslen") for p in extra)
    assert {p: b[p] for p in a} == a
    assert all(s.lengths_path is None for s in Manifest.load(str(plain)).split("train").shards)
    assert "lengths_field" not in Manifest.load(str(plain)).build


def test_a_missing_or_truncated_lengths_file_names_the_shard(tmp_path):
    out = tmp_path / "ds"
    build_shards(_samples(40), out, samples=SampleOptions(lengths="input_ids"))
    shard = Manifest.load(str(out)).split("train").shards[0]
    lengths = out / shard.lengths_path
    lengths.write_bytes(lengths.read_bytes()[:-1])
    with pytest.raises(ShardFormatError) as err:
        read_lengths(FS, str(out), shard)
    assert str(err.value) == (
        f"shard {shard.path}: lengths {shard.lengths_path}: 159 bytes, expected 40 lengths of "
        "4 bytes (one per sample of the shard)"
    )
    lengths.unlink()
    with pytest.raises(ShardFormatError) as err:
        read_lengths(FS, str(out), shard)
    assert str(err.value) == f"shard {shard.path}: its lengths file {shard.lengths_path} is missing"
    plain = tmp_path / "plain"
    build_shards(_samples(4), plain)
    shard = Manifest.load(str(plain)).split("train").shards[0]
    with pytest.raises(ShardFormatError, match=f"shard {shard.path}: no lengths in the manifest"):
        read_lengths(FS, str(plain), shard)


def test_a_sample_without_a_measurable_lengths_field_is_refused_by_key(tmp_path):
    samples = _samples(10)
    del samples[7]["input_ids"]
    samples[7]["input_ids_typo"] = [1]
    with pytest.raises(BuildError, match="sample 's00007' has no field 'input_ids'"):
        build_shards(samples, tmp_path / "a", samples=SampleOptions(lengths="input_ids"))
    with pytest.raises(BuildError, match="sample 's00000': lengths field 'i' is a int"):
        build_shards(_samples(3), tmp_path / "b", samples=SampleOptions(lengths="i"))
    with pytest.raises(ValueError, match="lengths"):
        SampleOptions(lengths=3)  # type: ignore[arg-type]


def test_sample_length_of_each_kind():
    assert sample_length(np.zeros((5, 2)), key="k", field="f") == 5
    assert sample_length([1, 2, 3], key="k", field="f") == 3
    assert sample_length("héllo", key="k", field="f") == 5
    assert sample_length(b"abcd", key="k", field="f") == 4
    with pytest.raises(ValueError, match="sample 'k': lengths field 'f' is a 0-d array"):
        sample_length(np.float32(1.0), key="k", field="f")


def test_the_lengths_field_is_part_of_the_build_fingerprint(tmp_path):
    out = tmp_path / "ds"
    build_shards(_samples(40), out)
    with pytest.raises(Exception, match="lengths_field"):
        build_shards(_samples(40), out, samples=SampleOptions(lengths="input_ids"))


def test_a_manifest_keeps_lengths_path_and_refuses_one_outside_the_root(tmp_path):
    from wdsloader.errors import ManifestError

    out = tmp_path / "ds"
    m = build_shards(_samples(8), out, samples=SampleOptions(lengths="input_ids"))
    again = Manifest.from_dict(m.to_dict())
    assert again.split("train").shards[0].lengths_path == m.split("train").shards[0].lengths_path
    d = m.to_dict()
    d["splits"]["train"]["shards"][0]["lengths_path"] = "../x.wdslen"
    with pytest.raises(ManifestError, match=r"train.shards\[0\].lengths_path: shard path"):
        Manifest.from_dict(d)


def test_the_manifest_holds_each_lengths_files_sha256_and_a_tampered_file_is_refused(tmp_path):
    out = tmp_path / "ds"
    build_shards(_samples(40), out, samples=SampleOptions(lengths="input_ids"))
    shard = Manifest.load(str(out)).split("train").shards[0]
    lengths = out / shard.lengths_path
    data = lengths.read_bytes()
    assert shard.lengths_sha256 == hashlib.sha256(data).hexdigest()
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["splits"]["train"]["shards"][0]["lengths_sha256"] == shard.lengths_sha256
    tampered = bytearray(data)
    tampered[4] ^= 1  # the second sample's length, the size unchanged
    lengths.write_bytes(bytes(tampered))
    with pytest.raises(ShardFormatError) as err:
        read_lengths(FS, str(out), shard)
    got = hashlib.sha256(bytes(tampered)).hexdigest()
    assert str(err.value) == (
        f"shard {shard.path}: lengths {shard.lengths_path}: sha256 {got} differs from the "
        f"manifest's {shard.lengths_sha256} (the file was changed or damaged after the build; "
        "rebuild it with `build-shards adopt --lengths FIELD`)"
    )


# ------------------------------------------------------------------------ adopt --lengths


def _write_wds(folder: Path, n: int) -> dict[str, tuple[int, int]]:
    """Shards written by webdataset's ShardWriter with a variable-length ``.npy`` and text;
    each key's (tokens length, text length)."""
    wds = pytest.importorskip("webdataset")
    folder.mkdir(parents=True)
    truth = {}
    with wds.ShardWriter(str(folder / "shard-%04d.tar"), maxcount=7, verbose=0) as w:
        for i in range(n):
            key = f"doc{i:04d}"
            truth[key] = (_length(i), i % 11)
            w.write({"__key__": key, "input_ids.npy": np.ones(_length(i), np.int32),
                     "text.txt": "é" * (i % 11)})  # fmt: skip
    return truth


def test_adding_lengths_leaves_a_readme_of_the_users_alone(tmp_path):
    from build_shards.adopt import adopt

    root = tmp_path / "ds"
    rows = [{"__key__": f"k{i:02d}", "input_ids": np.zeros(i % 4 + 1, np.int32)} for i in range(12)]
    build_shards(rows, root, splits={"train": 1.0})
    (root / "README.md").write_text("# my notes\n")
    assert adopt(root, lengths="input_ids").build["lengths_field"] == "input_ids"
    assert (root / "README.md").read_text() == "# my notes\n"


def test_adopt_lengths_on_webdataset_shards_records_each_samples_true_length(tmp_path):
    from build_shards.adopt import adopt

    root = tmp_path / "wds"
    truth = _write_wds(root / "train", 30)
    manifest = adopt(root, lengths="input_ids")
    assert manifest.build["lengths_field"] == "input_ids"
    shards = Manifest.load(str(root)).split("train").shards
    assert len(shards) == 5 and all(s.lengths_sha256 for s in shards)
    keys = [k for s in shards for k in _keys_in_order(root / s.path)]
    assert read_split_lengths(FS, str(root), shards).tolist() == [truth[k][0] for k in keys]
    # text: its characters; on a dataset with a manifest: the lengths only, nothing re-adopted
    card = (root / "README.md").read_bytes()
    again = adopt(root, lengths="text")
    assert again.build["lengths_field"] == "text" and again.build["adopted"] is True
    shards = Manifest.load(str(root)).split("train").shards
    assert read_split_lengths(FS, str(root), shards).tolist() == [truth[k][1] for k in keys]
    header, mark, body = card.decode().partition(CARD_MARK)
    assert mark and "- `.X.tar.wdslen`: the length of `input_ids` in each sample (every" in body
    # the card's header (each split's data_files as adopt found them) kept, its body up to date
    assert (root / "README.md").read_text() == header + mark + body.replace(
        "`input_ids` in each sample", "`text` in each sample"
    )
    with pytest.raises(FileExistsError):
        adopt(root)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_adopt_lengths_adds_them_to_a_built_dataset_equal_to_a_build_that_recorded_them(
    tmp_path, compression
):
    from build_shards.adopt import adopt
    from build_shards.cli.main import main

    plain, recorded = tmp_path / "plain", tmp_path / "recorded"
    opts = dict(OPTS, shards=ShardOptions(max_count=16, block_size=50, compression=compression))
    build_shards(_samples(120), plain, **opts)
    build_shards(_samples(120), recorded, samples=SampleOptions(lengths="input_ids"), **opts)
    before = Manifest.load(str(plain))
    assert main(["adopt", str(plain), "--lengths", "input_ids", "--no-progress"]) == 0
    after = Manifest.load(str(plain))
    want = Manifest.load(str(recorded))
    assert after.schema == before.schema and after.build["lengths_field"] == "input_ids"
    for name in ("train", "val"):
        for a, b in zip(after.split(name).shards, want.split(name).shards, strict=True):
            assert (a.lengths_path, a.lengths_sha256) == (b.lengths_path, b.lengths_sha256)
            assert (plain / a.lengths_path).read_bytes() == (recorded / b.lengths_path).read_bytes()
    with pytest.raises(ValueError, match=r"no field 'tokens' to measure \(--lengths\); the fields"):
        adopt(plain, lengths="tokens")
