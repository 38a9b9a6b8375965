"""The whole-batch read of fixed-size fields gives exactly what parsing every sample gives, and
falls back to that parse whenever the shard layout cannot be trusted."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from build_shards import build_shards
from tests.dataset_factory import write_dataset
from tests.shard_edit import header_of, patch_shard
from wdsloader import create_loader
from wdsloader.decode.gather import gather_rows, prefix_end, sample_keys
from wdsloader.errors import DecodeError, ShardFormatError
from wdsloader.format import BLOCK, Manifest

COUNTS = [37, 50, 13]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("gather") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


def passes(loader):
    return [b for b in loader]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)  # same fields, same order
        for name in x:
            if isinstance(x[name], torch.Tensor):
                assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), name
            else:
                assert x[name] == y[name], name


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"fields": ["vec"]},
        {"fields": ["meta", "vec"]},
        {"drop_last": False, "batch_size": 16},  # padding repeats samples
        {"num_workers": 2},
    ],
)
def test_gathered_batches_equal_parsed_batches(ds, kwargs):
    opts = {"batch_size": 8, "seed": 3, **kwargs}
    fast = create_loader(ds, "train", **opts)
    slow = create_loader(ds, "train", gather=False, **opts)
    a, b = passes(fast), passes(slow)
    assert_same(a, b)
    assert fast.stats["gathered_batches"] == len(a) and slow.stats["gathered_batches"] == 0


def test_a_custom_collator_gets_one_dict_per_sample(ds):
    seen = []

    def collate(samples):
        seen.append(samples)
        return len(samples)

    loader = create_loader(ds, "train", batch_size=10, collate_fn=collate, shuffle=False)
    assert passes(loader)[0] == 10
    first = seen[0][0]
    assert first["__key__"] == "train0000000" and first["meta"] == {"i": 0, "shard": 0}
    assert np.array_equal(first["vec"], np.arange(4, dtype=np.float32))
    assert loader.stats["gathered_batches"] > 0


@pytest.mark.parametrize("fields", [None, ["emb"], ["text", "neg"], ["label", "emb"]])
def test_builder_output_is_gathered(tmp_path, fields):
    rng = np.random.default_rng(0)
    rows = [
        {
            "__key__": f"s{i:05d}",
            "emb": rng.normal(size=8).astype(np.float32),
            "neg": rng.normal(size=(2, 8)).astype(np.float32),
            "label": i % 3,
            "text": "x" * (i % 7),
        }
        for i in range(120)
    ]
    build_shards(rows, str(tmp_path / "b"), shard_max_count=50)
    opts = {"batch_size": 16, "drop_last": False, "fields": fields}
    fast = create_loader(str(tmp_path / "b"), "train", **opts)
    slow = create_loader(str(tmp_path / "b"), "train", gather=False, **opts)
    assert_same(passes(fast), passes(slow))
    assert fast.stats["gathered_batches"] > 0


def test_a_stale_layout_falls_back_and_the_parse_names_the_sample(tmp_path):
    root = tmp_path / "ds"
    write_dataset(str(root), {"train": [20]})
    # break the .npy header of one sample in place (same size): the batch is parsed instead
    m = Manifest.load(str(root))
    shard = m.split("train").shards[0]
    offset, _ = shard.layout["vec.npy"]
    path = root / shard.path
    data = bytearray(path.read_bytes())
    idx = np.fromfile(str(root / shard.idx_path), dtype="<u8")
    at = int(idx[5]) + offset
    assert data[at : at + 6] == b"\x93NUMPY"
    data[at + 1 : at + 6] = b"NOPE!"
    path.write_bytes(bytes(data))
    loader = create_loader(str(root), "train", batch_size=20, shuffle=False, check_shards=False)
    with pytest.raises(DecodeError, match=r"train0000005.*'vec'"):
        passes(loader)
    skipping = create_loader(
        str(root), "train", batch_size=20, shuffle=False, check_shards=False, on_error="skip"
    )
    (batch,) = passes(skipping)
    assert len(batch["__key__"]) == 19 and "train0000005" not in batch["__key__"]
    assert skipping.stats["gathered_batches"] == 0


def test_shards_without_layout_are_parsed(ds, tmp_path):
    m = Manifest.load(ds)
    for shard in m.split("train").shards:
        shard.layout = None
    copy = tmp_path / "nolayout"
    copy.mkdir()
    import shutil

    shutil.copytree(ds, copy, dirs_exist_ok=True)
    m.save(str(copy))
    a = passes(create_loader(str(copy), "train", batch_size=8, seed=1))
    b = passes(create_loader(ds, "train", batch_size=8, seed=1))
    assert_same(a, b)


# -- the pure functions ----------------------------------------------------------------------


def test_prefix_end_walks_the_constant_members():
    # header 512 + 128 bytes data -> next header at 1024; then 512 + 10 -> 1024 + 1024
    layout = {"a.npy": [512, 128], "b.cls": [1536, 10]}
    assert prefix_end(layout) == 2048
    # a member after a variable one is not part of the prefix
    assert prefix_end({"a.npy": [512, 128], "z.npy": [9000, 4]}) == 1024
    assert prefix_end(None) == 0 and prefix_end({}) == 0


def test_gather_rows_refuses_rows_past_the_buffer():
    buf = np.arange(100, dtype=np.uint8)
    assert gather_rows(buf, np.array([0, 50]), 10).tolist()[1] == list(range(50, 60))
    assert gather_rows(buf, np.array([95]), 10) is None


def test_sample_keys_only_for_plain_headers():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("abc.txt", "dir/def.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    buf = np.frombuffer(out.getvalue(), dtype=np.uint8)
    assert sample_keys(buf, np.array([0])) == ["abc"]
    assert sample_keys(buf, np.array([0, 2 * BLOCK])) is None  # a directory part: parse instead
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("k" * 120 + ".txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    assert sample_keys(np.frombuffer(pax.getvalue(), dtype=np.uint8), np.array([0])) is None


def test_read_buffers_are_reused_only_when_nothing_refers_to_them(ds, monkeypatch):
    from wdsloader.decode import codecs as decode

    loader = create_loader(ds, "train", batch_size=4, shuffle_window=8, drop_last=False)
    expected = {k: m for b in passes(loader) for k, m in zip(b["__key__"], b["meta"], strict=True)}
    # a decoder that returns views into the read buffer (no copy): buffers must not be reused
    monkeypatch.setitem(decode._REGISTRY, "json", lambda buf: buf)
    viewing = create_loader(ds, "train", batch_size=4, shuffle_window=8, drop_last=False)
    kept = [(k, m) for b in passes(viewing) for k, m in zip(b["__key__"], b["meta"], strict=True)]
    import json

    assert {k: json.loads(bytes(m)) for k, m in kept} == expected


# -- what the whole-batch path reads is checked like the parser checks it ------------------------
N_BUILT = 37


def _built(tmp_path, labels: int = N_BUILT) -> str:
    """A builder dataset of one shard: emb f32[8] and neg f32[2, 8] at constant offsets (the
    layout), then label (``i % labels``: of one size for 10, then in the layout too, so the
    walk over the variable members starts at the first header) and text (sample
    ``s{i:05d}``)."""
    rows = [
        {
            "__key__": f"s{i:05d}",
            "emb": np.full(8, i, np.float32),
            "neg": np.full((2, 8), -i, np.float32),
            "label": i % labels,
            "text": "x" * (i % 5),
        }
        for i in range(N_BUILT)
    ]
    root = str(tmp_path / "b")
    build_shards(rows, root)
    return root


def _one_batch(root, **kwargs):
    loader = create_loader(
        root, "train", batch_size=N_BUILT, shuffle=False, drop_last=False, **kwargs
    )
    return loader, passes(loader)


@pytest.mark.parametrize("fields", [None, ["emb", "neg"], ["emb"]])
@pytest.mark.parametrize("gather", [True, False])
def test_a_flipped_byte_in_a_first_header_is_an_error_never_a_wrong_key(tmp_path, gather, fields):
    root = _built(tmp_path)
    at = {}

    def flip(data, idx):
        at["header"] = int(idx[5])
        assert data[at["header"] : at["header"] + 7] == b"s00005."
        data[at["header"] + 5] ^= 0x01  # s00005 -> s00004, a key of another sample

    rel = patch_shard(root, flip)
    expected = rf"{re.escape(rel)} at byte {at['header']}: corrupt tar header \(checksum mismatch\)"
    with pytest.raises(ShardFormatError, match=expected):
        _one_batch(root, gather=gather, fields=fields)
    loader, (batch,) = _one_batch(root, gather=gather, fields=fields, on_error="skip")
    assert batch["__key__"] == [f"s{i:05d}" for i in range(N_BUILT) if i != 5]
    assert batch["emb"][:, 0].tolist() == [i for i in range(N_BUILT) if i != 5]
    assert loader.stats["skipped_samples"] == 1


@pytest.mark.parametrize("labels", [N_BUILT, 10])
@pytest.mark.parametrize("ext", ["emb.npy", "neg.npy", "label.cls", "text.txt"])
def test_a_corrupt_member_header_is_an_error_on_the_gathered_path_too(tmp_path, ext, labels):
    """A flipped byte in the mtime of a gathered member's header (fixed-size fields read at the
    layout's offset, variable ones walked for the whole batch): the error the parser gives."""
    root = _built(tmp_path, labels)
    at = {}

    def flip(data, idx):
        at["header"] = header_of(data, idx, 7, ext)
        data[at["header"] + 140] ^= 0x01  # mtime: the name, size and data stay intact

    rel = patch_shard(root, flip)
    expected = rf"{re.escape(rel)} at byte {at['header']}: corrupt tar header \(checksum mismatch\)"
    for gather in (True, False):
        with pytest.raises(ShardFormatError, match=expected):
            _one_batch(root, gather=gather)


@pytest.mark.parametrize("shift", ["next_sample", "other_member", "one_byte", "one_block"])
def test_a_layout_that_lies_is_an_error_never_wrong_values(tmp_path, shift):
    root = _built(tmp_path)
    m = Manifest.load(root)
    shard = m.split("train").shards[0]
    idx = np.fromfile(f"{root}/{shard.idx_path}", dtype="<u8").astype(np.int64)
    off, size = shard.layout["emb.npy"]
    moved = {
        "next_sample": off + int(idx[1] - idx[0]),  # sample s00001's emb: its values
        "other_member": shard.layout["neg.npy"][0],
        "one_byte": off + 1,
        "one_block": off + BLOCK,
    }[shift]
    shard.layout["emb.npy"] = [moved, size]
    (Path(root) / "manifest.json").unlink()
    m.save(root)
    expected = (
        rf"{re.escape(shard.path)}: sample 's00000', field 'emb': the manifest's layout puts the "
        rf"member s00000\.emb\.npy at byte {moved} of the sample \(byte {int(idx[0]) + moved} "
        r"of the shard\), where the shard has .*: the manifest does not describe this shard"
    )
    for on_error in ("raise", "skip"):  # the manifest is wrong, not one sample: never skipped
        with pytest.raises(ShardFormatError, match=expected):
            _one_batch(root, on_error=on_error)
    _, (batch,) = _one_batch(root, gather=False)
    assert batch["emb"][:, 0].tolist() == list(range(N_BUILT))


def test_named_members_and_checksums_on_raw_headers():
    from wdsloader.decode.gather import key_ends, named_members
    from wdsloader.format import encode_header
    from wdsloader.format.ustar import checksums_ok

    first = np.frombuffer(encode_header("k1.a", 3) + encode_header("k22.a", 3), np.uint8)
    first = first.reshape(2, BLOCK)
    ends = key_ends(first)
    assert ends.tolist() == [2, 3]
    good = np.frombuffer(encode_header("k1.b.npy", 9) + encode_header("k22.b.npy", 9), np.uint8)
    good = good.reshape(2, BLOCK).copy()
    assert named_members(good, first[:, :100], ends, "b.npy", 9).tolist() == [True, True]
    assert named_members(good, first[:, :100], ends, "b.np", 9).tolist() == [False, False]
    assert named_members(good, first[:, :100], ends, "b.npy", 8).tolist() == [False, False]
    assert named_members(good[::-1], first[:, :100], ends, "b.npy", 9).tolist() == [False, False]
    assert checksums_ok(good).tolist() == [True, True]
    good[1, 140] ^= 1
    assert checksums_ok(good).tolist() == [True, False]
    # another form of the checksum field (seven digits and a NUL) is read like the parser does
    other = bytearray(encode_header("k1.b", 1))
    other[148:156] = b"%07o\0" % int(bytes(other[148:154]), 8)
    assert checksums_ok(np.frombuffer(bytes(other), np.uint8).reshape(1, BLOCK)).tolist() == [True]


def test_a_curriculum_variant_with_a_lying_layout_is_an_error(tmp_path):
    """The variant fields of a curriculum are gathered for the samples that drew them only (a
    mask): their headers are checked too. Here steer_a's layout points at steer_b's member."""
    from tests.test_curriculum_loader import CURR, write_curriculum_dataset

    root = write_curriculum_dataset(tmp_path / "c", [20], curriculum=CURR)
    m = Manifest.load(root)
    shard = m.split("train").shards[0]
    shard.layout["steer_a.npy"] = list(shard.layout["steer_b.npy"])
    (Path(root) / "manifest.json").unlink()
    m.save(root)
    loader = create_loader(root, "train", batch_size=20, shuffle=False)
    loader.dataset_obj.force_steering("a")
    with pytest.raises(
        ShardFormatError, match=r"sample 'k0000000', field 'steer_a': .*k0000000\.steer_b\.npy"
    ):
        passes(loader)
    loader.dataset_obj.force_steering("b")
    (batch,) = passes(loader)
    assert batch["steering"][:, 0].tolist() == [i * 10 + 2 for i in range(20)]
