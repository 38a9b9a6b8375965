"""compression="gzip": .tar.gz shards that every tar reader reads whole, whose samples our loader
still reads one by one through the index (exactly once, resume, ranks, corrupt samples)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile

import numpy as np
import pytest

from build_shards import build_shards
from wdsloader import create_loader
from wdsloader.errors import ManifestError, ShardFormatError
from wdsloader.format import Manifest, decode_index, index_path
from wdsloader.format.deflate import inflate_sample

N = 60


def rows(n: int = N) -> list[dict]:
    return [
        {
            "__key__": f"r{i:04d}",
            "id": i,
            "question": f"what is the {i % 13}th prime after {i * 7 % 97}?",
            "label": i % 10,
            "score": round((i * 37 % 1000) / 1000, 3),
            "emb": np.full(3, i, dtype=np.float32),
        }
        for i in range(n)
    ]


def as_list(samples: list[dict]) -> list[dict]:
    return samples


def build(root, **kw):
    kw.setdefault("shard_max_count", 16)
    kw.setdefault("block_size", 20)
    return build_shards(rows(), root, **kw)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("gz")
    plain = build(base / "plain")
    gz = build(base / "gz", compression="gzip")
    return base, plain, gz


def shard_files(root, manifest, split="train"):
    return [root / s.path for s in manifest.splits[split].shards]


def test_each_gzip_shard_is_the_plain_tar_compressed_and_the_index_finds_each_sample(pair):
    base, plain, gz = pair
    # blocks of 20: 16 + a remainder of 4 each; the three remainders packed into one shard
    assert [s.num_samples for s in gz.splits["train"].shards] == [16, 12, 16, 16]
    for p, g, ps, gs in zip(
        shard_files(base / "plain", plain),
        shard_files(base / "gz", gz),
        plain.splits["train"].shards,
        gz.splits["train"].shards,
        strict=True,
    ):
        assert g.name.endswith(".tar.gz") and gs.idx_path == index_path(gs.path)
        data = g.read_bytes()
        assert gzip.decompress(data) == p.read_bytes()  # one gzip stream: the plain tar
        assert (gs.num_bytes, gs.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert gs.compression == "gzip" and gs.layout is None
        gidx = decode_index((base / "gz" / gs.idx_path).read_bytes())
        pidx = decode_index((base / "plain" / ps.idx_path).read_bytes())
        plain_bytes = p.read_bytes()
        for i in range(gs.num_samples):
            sample = inflate_sample(data[gidx[i] : gidx[i + 1]], "x")
            assert sample == plain_bytes[pidx[i] : pidx[i + 1]]
        assert len(data) < len(plain_bytes) / 4


def test_manifest_declares_the_compression_and_a_version_older_readers_refuse(pair):
    base, plain, gz = pair
    raw = json.loads((base / "gz" / "manifest.json").read_text())
    assert raw["version"] == "2.1" and raw["build"]["compression"] == "gzip"
    assert {s["compression"] for s in raw["splits"]["train"]["shards"]} == {"gzip"}
    plain_raw = json.loads((base / "plain" / "manifest.json").read_text())
    assert plain_raw["version"] == "1.1" and "compression" not in plain_raw["build"]
    assert all("compression" not in s for s in plain_raw["splits"]["train"]["shards"])
    raw["splits"]["train"]["shards"][0]["compression"] = "zstd"
    with pytest.raises(ManifestError, match=r"train.shards\[0\].compression: expected null or"):
        Manifest.from_dict(raw)


@pytest.mark.usefixtures("build_workers")
def test_gzip_shards_are_byte_identical_with_1_and_2_workers(tmp_path):
    one = build(tmp_path / "w1", compression="gzip", workers=1)
    two = build(tmp_path / "w2", compression="gzip", workers=2)
    a, b = shard_files(tmp_path / "w1", one), shard_files(tmp_path / "w2", two)
    assert [f.read_bytes() for f in a] == [f.read_bytes() for f in b]
    assert [s.sha256 for s in one.splits["train"].shards] == [
        s.sha256 for s in two.splits["train"].shards
    ]


def test_gnu_tar_and_tarfile_stream_mode_list_every_member(pair):
    base, _plain, gz = pair
    names, streamed = [], []
    for f in shard_files(base / "gz", gz):
        out = subprocess.run(["tar", "-tzf", str(f)], capture_output=True, text=True, check=True)
        names += out.stdout.split()
        with open(f, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as tf:  # as webdataset
            streamed += [m.name for m in tf]
    assert len(names) == N * 5 and names == streamed
    assert names[:5] == [f"r0000.{e}" for e in ("emb.npy", "id.cls", "label.cls")] + [
        "r0000.question.txt",
        "r0000.score.json",
    ]


def test_webdataset_reads_every_sample(pair):
    wds = pytest.importorskip("webdataset")
    base, _plain, gz = pair
    urls = [str(f) for f in shard_files(base / "gz", gz)]
    got = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False).decode()}
    assert len(got) == N
    for item in rows():
        s = got[item["__key__"]]
        assert (s["id.cls"], s["label.cls"]) == (item["id"], item["label"])
        assert (s["question.txt"], s["score.json"]) == (item["question"], item["score"])
        np.testing.assert_array_equal(s["emb.npy"], item["emb"])


def test_hf_datasets_reads_every_sample(pair, tmp_path):
    datasets = pytest.importorskip("datasets")
    base, _plain, gz = pair
    ds = datasets.load_dataset(
        "webdataset",
        data_files={"train": [str(f) for f in shard_files(base / "gz", gz)]},
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert len(ds) == N
    by_key = {row["__key__"]: row for row in ds}
    for item in rows():
        row = by_key[item["__key__"]]
        assert (row["label.cls"], row["question.txt"]) == (item["label"], item["question"])


def batches(root, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("drop_last", False)
    return list(create_loader(str(root), "train", **kw))


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if hasattr(x[k], "shape"):
                assert x[k].dtype == y[k].dtype
                np.testing.assert_array_equal(x[k], y[k])
            else:
                assert x[k] == y[k]


@pytest.mark.parametrize("gather", [True, False])
def test_loader_reads_gzip_shards_exactly_once_as_the_plain_ones(pair, gather):
    base, _plain, _gz = pair
    got = batches(base / "gz", seed=3, gather=gather)
    keys = [k for b in got for k in b["__key__"]]
    assert sorted(keys) == [f"r{i:04d}" for i in range(N)]
    same(got, batches(base / "plain", seed=3, gather=gather))


def test_resume_on_gzip_shards_yields_exactly_the_rest(pair):
    base, _plain, _gz = pair
    kw = {"seed": 5, "num_workers": 2}
    full = batches(base / "gz", **kw)
    first = create_loader(str(base / "gz"), "train", batch_size=8, drop_last=False, **kw)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    resumed = create_loader(str(base / "gz"), "train", batch_size=8, drop_last=False, **kw)
    resumed.load_state_dict(state)
    same(list(resumed), full[3:])


def test_ranks_split_gzip_shards_into_disjoint_equal_parts(pair):
    base, _plain, _gz = pair
    parts = [batches(base / "gz", rank=r, world_size=2, drop_last=True) for r in (0, 1)]
    keys = [[k for b in p for k in b["__key__"]] for p in parts]
    assert len(parts[0]) == len(parts[1]) == 3
    assert not set(keys[0]) & set(keys[1]) and len(keys[0]) == len(keys[1]) == 24


def corrupt(root, manifest, sample: int, how: str) -> str:
    """Damage the compressed bytes of one sample of the first shard; its path."""
    shard = manifest.splits["train"].shards[0]
    idx = decode_index((root / shard.idx_path).read_bytes())
    data = bytearray((root / shard.path).read_bytes())
    a, b = int(idx[sample]), int(idx[sample + 1])
    if how == "block type":
        data[a] = 0xFF  # a final block of the reserved type 3
    else:
        data[b - 4 : b] = b"\x01\x02\x03\x04"  # no flush point at the end of the span
    (root / shard.path).write_bytes(bytes(data))
    return shard.path


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("block type", "corrupt compressed data: .*invalid block type"),
        ("flush", "compressed sample does not end at a flush point"),
    ],
)
def test_a_corrupt_compressed_sample_names_shard_and_sample_or_is_skipped(tmp_path, how, message):
    root = tmp_path / "ds"
    manifest = build(root, compression="gzip")
    path = corrupt(root, manifest, 3, how)
    with pytest.raises(ShardFormatError, match=rf"{path}: sample #3: {message}"):
        batches(root, shuffle=False)
    loader = create_loader(
        str(root), "train", batch_size=8, shuffle=False, drop_last=False, on_error="skip"
    )
    keys = [k for b in loader for k in b["__key__"]]
    assert len(keys) == N - 1 and "r0003" not in keys and len(set(keys)) == N - 1
    assert loader.stats["skipped_samples"] == 1


def test_an_adopted_plain_tar_gz_is_refused_with_the_way_out(tmp_path):
    from build_shards.adopt import adopt

    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "a.tar.gz", "w:gz") as tf:
        info = tarfile.TarInfo("k0.txt")
        info.size = 2
        tf.addfile(info, fileobj=io.BytesIO(b"hi"))
    with pytest.raises(
        ShardFormatError, match=r"a.tar.gz: compressed tars are not supported.*gunzip"
    ):
        adopt(str(tmp_path / "wds"))


def test_the_validator_reads_gzip_shards(pair):
    from wdsloader.validate import validate_dataset

    base, _plain, _gz = pair
    report = validate_dataset(str(base / "gz"), deep=True)
    assert report.ok, report.problems
    assert report.samples_checked == N


# -- decompression bombs ---------------------------------------------------------------------------
BOMB = 64 << 20  # zeros: they deflate to ~64 KB


def deflated(tar_bytes: bytes) -> bytes:
    """``tar_bytes`` compressed as the shard writer compresses one sample."""
    from wdsloader.format.deflate import ShardDeflater

    return ShardDeflater().sample(tar_bytes)


def replace_sample(root, manifest, sample: int, tar_bytes: bytes) -> tuple[str, bytes]:
    """Replace sample ``sample`` of the first shard with the deflated ``tar_bytes`` (the index
    and the manifest follow); the shard's path and the new compressed span."""
    from wdsloader.format import encode_index

    shard = manifest.splits["train"].shards[0]
    idx = decode_index((root / shard.idx_path).read_bytes()).astype(np.int64)
    data = (root / shard.path).read_bytes()
    a, b = int(idx[sample]), int(idx[sample + 1])
    span = deflated(tar_bytes)
    new = data[:a] + span + data[b:]
    idx[sample + 1 :] += len(span) - (b - a)
    (root / shard.path).write_bytes(new)
    (root / shard.idx_path).write_bytes(encode_index(idx))
    shard.num_bytes, shard.sha256 = len(new), hashlib.sha256(new).hexdigest()
    manifest.save(str(root))
    return shard.path, span


def sample_tar(root, manifest, sample: int) -> bytes:
    shard = manifest.splits["train"].shards[0]
    idx = decode_index((root / shard.idx_path).read_bytes())
    data = (root / shard.path).read_bytes()
    return inflate_sample(data[int(idx[sample]) : int(idx[sample + 1])], "x")


def peak_bytes(call) -> int:
    """The most bytes Python and zlib held at once during ``call()`` (tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            call()
        except ShardFormatError:
            pass
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_decompression_bomb_after_a_valid_sample_names_shard_and_sample(tmp_path):
    root = tmp_path / "ds"
    manifest = build(root, compression="gzip")
    valid = sample_tar(root, manifest, 3)
    path, span = replace_sample(root, manifest, 3, valid + bytes(BOMB))
    assert len(span) < BOMB // 500
    message = (
        rf"{path}: sample #3: more data than its tar headers declare: a zero block at byte "
        rf"{len(valid)} of the inflated sample, after its members \(a decompression bomb"
    )
    with pytest.raises(ShardFormatError, match=message):
        inflate_sample(span, f"{path}: sample #3")
    with pytest.raises(ShardFormatError, match=message):
        batches(root, shuffle=False)
    loader = create_loader(
        str(root), "train", batch_size=8, shuffle=False, drop_last=False, on_error="skip"
    )
    keys = [k for b in loader for k in b["__key__"]]
    assert len(keys) == N - 1 and "r0003" not in keys and len(set(keys)) == N - 1
    # memory stays bounded by what the headers declare: a few blocks, not the 64 MiB
    assert peak_bytes(lambda: inflate_sample(span, "x")) < 1 << 20


def test_inflate_never_holds_more_than_max_length(tmp_path):
    root = tmp_path / "ds"
    manifest = build(root, compression="gzip")
    valid = sample_tar(root, manifest, 0)
    span = replace_sample(root, manifest, 0, valid)[1]
    assert inflate_sample(span, "x", max_length=len(valid)) == valid
    with pytest.raises(ShardFormatError, match=r"^s #0: the member at byte \d+ of the inflated "):
        inflate_sample(span, "s #0", max_length=len(valid) - 1)
    bomb = replace_sample(root, manifest, 0, valid + bytes(BOMB))[1]
    with pytest.raises(ShardFormatError, match=r"^s #0: the sample inflates to more than max_le"):
        inflate_sample(bomb, "s #0", max_length=len(valid))  # the zeros: past the bound
    assert peak_bytes(lambda: inflate_sample(bomb, "s #0", max_length=1 << 20)) < 2 << 20
    # a member that declares 64 MiB (of zeros): refused before it is inflated
    info = tarfile.TarInfo("r0000.big.bin")
    info.size = BOMB
    big = deflated(info.tobuf(format=tarfile.USTAR_FORMAT) + bytes(BOMB))
    assert len(inflate_sample(big, "x")) == BOMB + 512  # declared: allowed without a bound
    assert peak_bytes(lambda: inflate_sample(big, "x", max_length=1 << 20)) < 2 << 20
    with pytest.raises(ShardFormatError, match=r"at byte 0 .* declares 67108864 bytes, past max_"):
        inflate_sample(big, "x", max_length=1 << 20)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_a_member_declaring_more_than_its_span_can_inflate_to_is_refused_first(fmt):
    # a declared size past 2^40 must not lift the bomb check: deflate inflates at most 1032
    # bytes per compressed byte, so 2^41 bytes from a 64 KB span is a lie, refused unread
    info = tarfile.TarInfo("r0000.big.bin")
    info.size = 1 << 41
    bomb = deflated(info.tobuf(format=fmt) + bytes(BOMB))
    header = len(info.tobuf(format=fmt)) - 512
    message = (
        rf"^s #0: the member at byte {header} of the inflated sample declares 2199023255552 "
        rf"bytes, more than its {len(bomb)} compressed bytes can hold \(a decompression bomb "
    )
    with pytest.raises(ShardFormatError, match=message):
        inflate_sample(bomb, "s #0")
    assert peak_bytes(lambda: inflate_sample(bomb, "s #0")) < 2 << 20
