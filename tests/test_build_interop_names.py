"""Other readers load the folders we build and adopt as they are: Hugging Face ``datasets`` by the
folder alone (our index files are hidden, the dataset card names each split's shards),
webdataset's download cache by shard file name (the split is in it), and another tool's
``X.tar.idx`` is never overwritten. Datasets written with the earlier names still read."""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from build_shards import SampleOptions, build_shards
from build_shards.adopt import adopt
from build_shards.commit.card import card_text
from tests.http_server import http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.format import Manifest

N = 40


def make_items() -> list[dict]:
    return [
        {"__key__": f"q{i:04d}", "emb": np.full(4, i, np.float32), "text": f"t{i}"}
        for i in range(N)
    ]


def tar_keys(path: Path) -> list[str]:
    """The sample keys of a tar, in order (webdataset's grouping: consecutive members)."""
    keys: list[str] = []
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            key = m.name.split("/")[-1].split(".")[0]
            if not keys or keys[-1] != key:
                keys.append(key)
    return keys


def split_keys(root: Path, manifest: Manifest) -> dict[str, list[str]]:
    return {
        split: sorted(k for s in info.shards for k in tar_keys(root / s.path))
        for split, info in manifest.splits.items()
    }


def loader_keys(root: Path, split: str) -> list[str]:
    loader = create_loader(str(root), split=split, batch_size=1, shuffle=False, num_workers=0)
    return sorted(k for batch in loader for k in batch["__key__"])


def hf_keys(datasets, tmp_path: Path, *args, streaming: bool, **kwargs) -> dict[str, list[str]]:
    ds = datasets.load_dataset(
        *args, streaming=streaming, cache_dir=str(tmp_path / "hf-cache"), **kwargs
    )
    return {split: sorted(row["__key__"] for row in rows) for split, rows in ds.items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Manifest]:
    root = tmp_path_factory.mktemp("names") / "ds"
    manifest = build_shards(
        make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7, block_size=16
    )
    return root, manifest


def write_foreign(root: Path, shards: dict[str, list[str]]) -> dict[str, list[str]]:
    """Tars as another tool writes them (``{rel path: [keys]}``); the keys per split folder."""
    out: dict[str, list[str]] = {}
    for rel, keys in shards.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for key in keys:
                for ext, data in (("txt", key.encode()), ("cls", b"1")):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        out.setdefault(rel.split("/")[0], []).extend(keys)
    return {split: sorted(keys) for split, keys in out.items()}


FOREIGN = {
    "train/part-0.tar": ["a0", "a1", "a2"],
    "train/part-1.tar": ["a3", "a4"],
    "validation/part-0.tar": ["b0", "b1"],
}


# -- names ------------------------------------------------------------------------------------------
def test_built_shards_carry_their_split_and_hidden_indexes(built):
    root, manifest = built
    for split, info in manifest.splits.items():
        for s in info.shards:
            name = s.path.split("/")[-1]
            assert s.path == f"{split}/{name}" and name.startswith(f"{split}-")
            assert s.idx_path == f"{split}/.{name}.wdsidx"
            assert (root / s.idx_path).is_file()
    names = [s.path.split("/")[-1] for info in manifest.splits.values() for s in info.shards]
    assert len(names) == len(set(names))
    assert not list(root.rglob("*.tar.idx"))


def test_webdataset_cache_dir_keeps_the_splits_apart(built, http_server, tmp_path):
    """webdataset (like wids) caches a downloaded shard under its file name: a val shard named
    like a train shard was served from the cache with train's samples."""
    wds = pytest.importorskip("webdataset")
    root, manifest = built
    shutil.copytree(root, http_server.root / "ds")
    expected = split_keys(root, manifest)
    cache = tmp_path / "wds-cache"
    cache.mkdir()
    for split in ("train", "val"):
        urls = [f"{http_server.url}/ds/{s.path}" for s in manifest.splits[split].shards]
        got = sorted(
            s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, cache_dir=str(cache))
        )
        assert got == expected[split]


# -- Hugging Face datasets ----------------------------------------------------------------------
@pytest.mark.parametrize("streaming", [False, True])
def test_hf_load_dataset_reads_a_built_folder(built, tmp_path, streaming):
    datasets = pytest.importorskip("datasets")
    root, manifest = built
    expected = split_keys(root, manifest)
    assert hf_keys(datasets, tmp_path, str(root), streaming=streaming) == expected
    by_dir = hf_keys(datasets, tmp_path, "webdataset", data_dir=str(root), streaming=streaming)
    assert by_dir == {"train": expected["train"], "validation": expected["val"]}


def test_hf_load_dataset_reads_a_gzip_build(tmp_path):
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "gz"
    manifest = build_shards(
        make_items(), root, splits={"train": 0.5, "val": 0.5}, shard_max_count=7, compression="gzip"
    )
    assert '"train/*.tar.gz"' in (root / "README.md").read_text()
    expected = split_keys(root, manifest)
    for streaming in (False, True):
        assert hf_keys(datasets, tmp_path, str(root), streaming=streaming) == expected


@pytest.mark.parametrize("streaming", [False, True])
def test_adopt_keeps_a_folder_hf_loaded_loadable(tmp_path, streaming):
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "foreign"
    expected = write_foreign(root, FOREIGN)
    before = hf_keys(datasets, tmp_path, "webdataset", data_dir=str(root), streaming=streaming)
    assert before == expected
    adopt(root)
    assert hf_keys(datasets, tmp_path, str(root), streaming=streaming) == expected
    by_dir = hf_keys(datasets, tmp_path, "webdataset", data_dir=str(root), streaming=streaming)
    assert by_dir == expected
    assert loader_keys(root, "validation") == expected["validation"]


def test_adopt_never_overwrites_another_tools_index(tmp_path):
    """Megatron-Energon keeps its own index at ``X.tar.idx``: adopt leaves it as it is, our
    loader reads through our own index, and HF still loads the folder through the card."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "foreign"
    expected = write_foreign(root, FOREIGN)
    theirs: dict[Path, bytes] = {}
    for rel in FOREIGN:
        other = root / f"{rel}.idx"
        other.write_bytes(np.array([0, 1536, 3072], "<u8").tobytes() + b"energon")
        theirs[other] = other.read_bytes()
    adopt(root)
    assert {p: p.read_bytes() for p in theirs} == theirs
    assert loader_keys(root, "train") == expected["train"]
    assert hf_keys(datasets, tmp_path, str(root), streaming=False) == expected
    for path in theirs:  # the other tool indexes again after adopt: our index is not its file
        path.write_bytes(b"rewritten by energon prepare")
    assert loader_keys(root, "train") == expected["train"]


# -- the dataset card ---------------------------------------------------------------------------
def test_card_names_each_splits_shards(built):
    root, _ = built
    text = (root / "README.md").read_text()
    assert text.startswith("---\nconfigs:\n- config_name: default\n  data_files:\n")
    assert '  - split: "train"\n    path:\n    - "train/*.tar"\n' in text
    assert '  - split: "val"\n    path:\n    - "val/*.tar"\n' in text


def test_card_of_splits_sharing_a_folder_lists_their_shards(tmp_path):
    """Splits found by a pattern in one folder: a glob would give each split the other's
    shards, so the card names the files."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "flat"
    write_foreign(root, {"data/train-0.tar": ["a0", "a1"], "data/test-0.tar": ["b0"]})
    adopt(root, splits=r"(?P<split>train|test)-\d+\.tar")
    text = (root / "README.md").read_text()
    assert '    - "data/train-0.tar"\n' in text and '    - "data/test-0.tar"\n' in text
    expected = {"train": ["a0", "a1"], "test": ["b0"]}
    assert hf_keys(datasets, tmp_path, str(root), streaming=False) == expected


def test_card_renames_a_split_hf_refuses(tmp_path):
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "ds"
    manifest = build_shards(make_items(), root, splits={"train": 0.5, "hold-out": 0.5})
    assert (
        '  - split: "hold_out"\n    path:\n    - "hold-out/*.tar"\n'
        in (root / "README.md").read_text()
    )
    expected = split_keys(root, manifest)
    got = hf_keys(datasets, tmp_path, str(root), streaming=True)
    assert got == {"train": expected["train"], "hold_out": expected["hold-out"]}


def test_card_never_replaces_a_users_readme(tmp_path, caplog):
    root = tmp_path / "foreign"
    write_foreign(root, FOREIGN)
    (root / "README.md").write_text("# my notes\n")
    with caplog.at_level(logging.WARNING):
        adopt(root)
    assert (root / "README.md").read_text() == "# my notes\n"
    assert any(
        f"{root}/README.md exists and was not written by wdsloader" in r.getMessage()
        for r in caplog.records
    )
    adopt(root, overwrite=True)  # a card of ours is rewritten: a second adopt is not refused
    assert (root / "README.md").read_text() == "# my notes\n"


def test_card_is_rewritten_by_a_rebuild(tmp_path):
    root = tmp_path / "ds"
    build_shards(make_items(), root, splits={"train": 0.5, "val": 0.5}, shard_max_count=7)
    build_shards(make_items(), root, splits={"train": 0.5, "test": 0.5}, overwrite=True)
    text = (root / "README.md").read_text()
    assert '"test/*.tar"' in text and '"val/*.tar"' not in text


# -- datasets written with the earlier names -----------------------------------------------------
def to_legacy_names(root: Path) -> Manifest:
    """Rename a built dataset's files as earlier versions wrote them: ``train/shard-BBBBB-PPP.tar``
    with ``train/shard-BBBBB-PPP.tar.idx`` beside it."""
    body = json.loads((root / "manifest.json").read_text())
    for info in body["splits"].values():
        for s in info["shards"]:
            split, name = s["path"].split("/")
            old = f"{split}/shard{name[len(split) :]}"
            (root / s["path"]).rename(root / old)
            (root / s["idx_path"]).rename(root / f"{old}.idx")
            (root / s.pop("keys_path")).unlink()  # no key index then
            s["path"], s["idx_path"] = old, f"{old}.idx"
    (root / "manifest.json").write_text(json.dumps(body))
    return Manifest.load(str(root))


def test_a_dataset_with_the_earlier_names_still_reads(tmp_path):
    root = tmp_path / "old"
    build_shards(make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7)
    manifest = to_legacy_names(root)
    assert not list(root.rglob("*.wdsidx"))
    expected = split_keys(root, manifest)
    assert {split: loader_keys(root, split) for split in manifest.splits} == expected


def test_a_rebuild_replaces_a_dataset_with_the_earlier_names(tmp_path):
    root = tmp_path / "old"
    build_shards(make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7)
    to_legacy_names(root)
    manifest = build_shards(
        make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7, overwrite=True
    )
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    listed = sorted(
        p
        for info in manifest.splits.values()
        for s in info.shards
        for p in (s.path, s.idx_path, s.keys_path)
    )
    assert files == sorted([*listed, "README.md", "manifest.json"])
    assert not any("shard-" in f for f in files)


def test_a_rebuild_leaves_other_tools_files_in_the_split_folders(tmp_path):
    root = tmp_path / "ds"
    build_shards(make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7)
    theirs = {
        root / "train" / "train-00000-000.tar.idx": b"energon's index",
        root / "train" / "notes.txt": b"mine",
    }
    for path, data in theirs.items():
        path.write_bytes(data)
    manifest = build_shards(
        make_items(), root, splits={"train": 0.7, "val": 0.3}, shard_max_count=7, overwrite=True
    )
    assert {p: p.read_bytes() for p in theirs} == theirs
    assert all("-r-" in s.path for info in manifest.splits.values() for s in info.shards)
    assert not (root / "train" / "train-00000-000.tar").exists()  # ours, replaced


def test_card_keeps_split_names_yaml_would_read_as_other_types(tmp_path):
    """A split named ``1``, ``null`` or ``yes`` is a string in the card's YAML, not an int,
    None or True (``datasets`` failed with 'expected string or bytes-like object')."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "ds"
    manifest = build_shards(make_items(), root, splits={"1": 0.4, "null": 0.3, "yes": 0.3})
    assert '  - split: "null"\n    path:\n    - "null/*.tar"\n' in (root / "README.md").read_text()
    assert hf_keys(datasets, tmp_path, str(root), streaming=False) == split_keys(root, manifest)


def test_card_leaves_out_a_split_without_samples(tmp_path):
    """A split that got no sample had 'path:' with no entry (None in YAML), and load_dataset
    failed with 'Expected data_files in YAML to be either a string or a list of strings'."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path / "ds"
    rows = [{"__key__": f"k{i}", "text": f"t{i}"} for i in range(10)]
    manifest = build_shards(rows, root, splits={"train": 0.9, "val": 0.05, "test": 0.05})
    empty = [split for split, info in manifest.splits.items() if not info.shards]
    assert empty
    text = (root / "README.md").read_text()
    assert all(f'split: "{split}"' not in text for split in empty)
    expected = {s: keys for s, keys in split_keys(root, manifest).items() if s not in empty}
    assert hf_keys(datasets, tmp_path, str(root), streaming=False) == expected


def test_card_lists_the_side_files_the_manifest_declares(tmp_path):
    """Beside the shards' index, the card names each other side file the manifest lists (the
    key index, the lengths of the declared field), with how many shards have one."""
    root = tmp_path / "ds"
    rows = [{"__key__": f"k{i:03d}", "input_ids": np.zeros(i % 5 + 1, np.int32)} for i in range(30)]
    manifest = build_shards(rows, root, splits={"train": 1.0}, shard_max_count=10,
                            samples=SampleOptions(lengths="input_ids"))  # fmt: skip
    shards = manifest.splits["train"].shards
    assert all(s.keys_path and s.lengths_path for s in shards) and len(shards) == 3
    text = (root / "README.md").read_text()
    assert (
        "- `.X.tar.wdsidx`: the index of each sample's offset in the shard (every shard)\n" in text
    )
    assert "- `.X.tar.wdskeys`: the key index, each sample found by its key (every shard)\n" in text
    assert "- `.X.tar.wdslen`: the length of `input_ids` in each sample (every shard)\n" in text


def test_card_side_files_are_the_manifests_own_names_and_counts():
    """The names come from the manifest (a legacy ``X.tar.idx`` stays that name), and a side
    file some shards lack says how many have one; none is listed that no shard has."""
    from wdsloader.format import ShardInfo, SplitInfo

    def shard(i: int, **paths: str) -> ShardInfo:
        return ShardInfo(path=f"train/shard-{i}.tar", idx_path=f"train/shard-{i}.tar.idx",
                         num_samples=4, num_bytes=4096, **paths)  # fmt: skip

    shards = [shard(0, lengths_path="train/.shard-0.tar.wdslen"), shard(1), shard(2)]
    manifest = Manifest(splits={"train": SplitInfo(shards=shards)}, build={})
    text = card_text(manifest, {"train": ["train/*.tar"]})
    assert "- `X.tar.idx`: the index of each sample's offset in the shard (every shard)\n" in text
    assert "- `.X.tar.wdslen`: the length of each sample (1 of 3 shards)\n" in text
    assert "wdsidx" not in text and "wdskeys" not in text and "key index" not in text
