"""ShardStore: exact bytes from a local folder, S3 (loopback moto) and HTTP (a local server that
drops connections), retries resumed at the byte offset, the shard cache, checksums, and stores
pickled into worker processes."""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.dataset_factory import write_dataset
from tests.http_server import (  # noqa: F401
    Faults,
    RangeHTTPServer,
    SilentServer,
    http_server_fixture,
)
from wdsloader import create_loader
from wdsloader.errors import ManifestError, ShardFormatError, ShardReadError
from wdsloader.format import Manifest, ShardInfo, scan_tar
from wdsloader.io import ReadOptions, ShardStore
from wdsloader.io.storage import url_to_fs, with_timeouts

Req = tuple[ShardInfo, int, int]


# -- helpers ---------------------------------------------------------------------------------------
def sample_ranges(store: ShardStore, shards: list[ShardInfo]) -> list[Req]:
    """One request per sample of every shard, from the shard's index."""
    out = []
    for shard in shards:
        off = store.index(shard)
        out += [(shard, off[i], off[i + 1]) for i in range(shard.num_samples)]
    return out


def expected(folder: Path, reqs: list[Req]) -> list[bytes]:
    """The same ranges read straight from the files under ``folder``."""
    return [(folder / s.path).read_bytes()[a:b] for s, a, b in reqs]


def served_dataset(server: RangeHTTPServer, counts: list[int], name: str = "ds"):
    """``(url, manifest, local folder)`` of a dataset written under the server's root."""
    folder = server.root / name
    manifest = write_dataset(str(folder), {"train": counts})
    return f"{server.url}/{name}", manifest, folder


def pieces(reqs: list[Req], step: int) -> int:
    """Requests needed for sample ranges that cover each shard from 0 to its last sample's end."""
    ends: dict[str, int] = {}
    for shard, _, b in reqs:
        ends[shard.path] = max(ends.get(shard.path, 0), int(b))
    return sum(math.ceil(end / step) for end in ends.values())


def reset_stats(store: ShardStore) -> None:
    store.stats.update(dict.fromkeys(store.stats, 0))


def gets(server: RangeHTTPServer, shard: ShardInfo) -> list:
    return [r for r in server.requests() if r.method == "GET" and r.path.endswith(shard.path)]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.exists() else 0


@pytest.fixture()
def local_ds(tmp_path: Path) -> tuple[str, Manifest]:
    root = tmp_path / "ds"
    return str(root), write_dataset(str(root), {"train": [5, 7, 3]})


# -- local -----------------------------------------------------------------------------------------
def test_local_index_matches_the_idx_file_and_the_tar(local_ds):
    root, m = local_ds
    store = ShardStore(root)
    for shard in m.splits["train"].shards:
        off = store.index(shard)
        raw = np.frombuffer((Path(root) / shard.idx_path).read_bytes(), dtype="<u8")
        scanned, keys = scan_tar((Path(root) / shard.path).read_bytes())
        assert off.dtype == np.int64 and not off.flags.writeable
        np.testing.assert_array_equal(off, raw)
        np.testing.assert_array_equal(off, scanned)
        assert len(keys) == shard.num_samples
        assert store.index(shard) is off  # cached


def test_a_joined_read_over_more_shards_than_open_files_reads_each_file(local_ds):
    """A joined read whose requests span more shards than ``max_open_files``: the descriptors
    it collected stay open until it has read (closing the least recently used one of them
    failed the read with EBADF, or read another file that got the descriptor's number)."""
    root, m = local_ds
    shards = m.splits["train"].shards
    assert len(shards) >= 3
    store = ShardStore(root, ReadOptions(max_open_files=1))
    reqs = sample_ranges(store, shards)
    reqs = [reqs[i] for i in np.random.default_rng(1).permutation(len(reqs))]
    buf, positions = store.read_joined(reqs)
    got = [bytes(buf[p : p + b - a]) for p, (_, a, b) in zip(positions, reqs, strict=True)]
    assert got == expected(Path(root), reqs)
    other = store.read_ranges(reqs[:1])  # the limit holds again after the read
    assert other == expected(Path(root), reqs[:1]) and len(store._files._fds) <= 1
    store.close()


def test_local_read_ranges_exact_bytes(local_ds):
    root, m = local_ds
    shards = m.splits["train"].shards
    store = ShardStore(root, ReadOptions(max_open_files=1))  # interleaved shards reopen files
    reqs = sample_ranges(store, shards)
    order = np.random.default_rng(0).permutation(len(reqs))
    reqs = [reqs[i] for i in order]
    reqs += [(shards[0], 0, 0), (shards[1], 0, shards[1].num_bytes), (shards[2], 13, 1000)]
    out = store.read_ranges(reqs)
    assert out == expected(Path(root), reqs)
    assert all(type(b) is bytes for b in out)
    assert store.stats["requests"] == len(reqs)
    assert store.stats["bytes_read"] == sum(b - a for _, a, b in reqs)
    assert store.read_ranges([]) == []
    with pytest.raises(ValueError, match="invalid byte range"):
        store.read_ranges([(shards[0], 10, 5)])
    store.close()
    assert store.read_ranges(reqs[:2]) == out[:2]  # usable again after close


@pytest.mark.parametrize(
    "fault, error, words",
    [
        ("missing_idx", ShardFormatError, [".shard-000001.tar.wdsidx", "not found"]),
        ("short_idx", ShardFormatError, [".shard-000001.tar.wdsidx", "expected 64"]),
        ("count_mismatch", ShardFormatError, [".shard-000001.tar.wdsidx", "expected 72"]),
        ("unordered_idx", ShardFormatError, [".shard-000001.tar.wdsidx", "increasing"]),
        ("missing_shard", FileNotFoundError, ["shard-000001.tar"]),
        ("truncated_shard", ShardFormatError, ["shard-000001.tar", "truncated", "offset 10000"]),
    ],
)
def test_local_faults_name_the_file(local_ds, fault, error, words):
    root, m = local_ds
    shard = m.splits["train"].shards[1]
    tar, idx = Path(root) / shard.path, Path(root) / shard.idx_path
    offsets = np.frombuffer(idx.read_bytes(), dtype="<u8").copy()
    if fault == "missing_idx":
        idx.unlink()
    elif fault == "short_idx":
        idx.write_bytes(offsets[:-1].tobytes())
    elif fault == "count_mismatch":
        shard.num_samples += 1
    elif fault == "unordered_idx":
        offsets[[2, 3]] = offsets[[3, 2]]
        idx.write_bytes(offsets.tobytes())
    elif fault == "missing_shard":
        tar.unlink()
    elif fault == "truncated_shard":
        tar.write_bytes(tar.read_bytes()[:10000])
    store = ShardStore(root)
    with pytest.raises(error) as info:
        store.read_ranges(sample_ranges(store, [shard]))
    for word in words:
        assert word in str(info.value)


def test_check_shards_local(local_ds):
    root, m = local_ds
    shards = m.splits["train"].shards
    store = ShardStore(root)
    store.check_shards(shards)
    with open(Path(root) / shards[0].path, "ab") as f:
        f.write(b"x")
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar: file has \d+ bytes"):
        store.check_shards(shards)
    (Path(root) / shards[0].path).unlink()
    (Path(root) / shards[2].idx_path).unlink()
    with pytest.raises(FileNotFoundError, match="2 shard file") as info:
        store.check_shards(shards)
    assert info.value.filename.endswith("train/shard-000000.tar")
    assert ".shard-000002.tar.wdsidx" in str(info.value)


# -- S3 (moto server on loopback, through s3fs) ---------------------------------------------------
def test_s3_exact_bytes_split_and_coalesced(s3_bucket, s3_transport):
    url, opts = s3_bucket
    root = f"{url}/ds"
    m = write_dataset(root, {"train": [20, 13, 7]}, storage_options=opts)
    shards = m.splits["train"].shards
    fs, base = url_to_fs(root, opts)
    files = {s.path: fs.cat_file(f"{base}/{s.path}") for s in shards}
    step = 4096
    read = ReadOptions(storage_options=opts, max_request_bytes=step, transport=s3_transport)
    store = ShardStore(root, read)
    store.check_shards(shards)
    reqs = sample_ranges(store, shards) + [(s, 0, s.num_bytes) for s in shards]
    reset_stats(store)
    out = store.read_ranges(reqs)
    assert out == [files[s.path][a:b] for s, a, b in reqs]
    # each shard's requests coalesce into one span, fetched in pieces of <= 4096 bytes
    assert store.stats["requests"] == sum(math.ceil(s.num_bytes / step) for s in shards)
    assert store.stats["retries"] == 0

    last = shards[2]
    fs.pipe_file(f"{base}/{last.path}", files[last.path][:5000])
    with pytest.raises(ShardFormatError, match=r"shard-000002\.tar: truncated.* offset 5000"):
        store.read_ranges([(last, 4000, 6000)])  # the range straddles the new end
    with pytest.raises(ShardFormatError, match=r"shard-000002\.tar: truncated.* offset 6000"):
        store.read_ranges([(last, 6000, 7000)])  # S3 answers 416
    with pytest.raises(ShardFormatError, match=r"shard-000002\.tar: file has 5000 bytes"):
        store.check_shards(shards)
    fs.pipe_file(f"{base}/{last.path}", files[last.path])
    fs.rm(f"{base}/{shards[1].path}")
    with pytest.raises(FileNotFoundError) as info:
        store.check_shards(shards)
    assert info.value.filename == f"{root}/{shards[1].path}"
    with pytest.raises(FileNotFoundError) as info:
        store.read_ranges([(shards[1], 0, 10)])
    assert info.value.filename == f"{root}/{shards[1].path}"
    assert store.stats["retries"] == 0


# -- HTTP (local threaded server) ------------------------------------------------------------------
def test_http_exact_bytes_despite_dropped_connections(http_server):
    root, m, folder = served_dataset(http_server, [40, 25])
    shards = m.splits["train"].shards
    store = ShardStore(root, ReadOptions(backoff=0, max_request_bytes=8192, concurrency=4))
    reqs = sample_ranges(store, shards)
    reset_stats(store)
    http_server.faults = Faults(first_gets=4)
    out = store.read_ranges(reqs)
    assert out == expected(folder, reqs)
    assert http_server.drops() == 4
    assert store.stats["retries"] == 4
    assert store.stats["requests"] == pieces(reqs, 8192) + 4
    assert store.stats["bytes_fetched"] == sum(b - a for _, a, b in reqs)


def test_http_retry_resumes_at_the_first_missing_byte(http_server):
    root, m, folder = served_dataset(http_server, [60])
    shard = m.splits["train"].shards[0]
    n = shard.num_bytes
    x = n // 3 + 77  # not aligned to anything
    http_server.faults = Faults(at_byte=x, at_byte_times=2)
    store = ShardStore(root, ReadOptions(backoff=0))
    (data,) = store.read_ranges([(shard, 0, n)])
    assert data == (folder / shard.path).read_bytes()
    log = gets(http_server, shard)
    # dropped after the bytes before x, then at once (x is the first byte of the retry), then ok
    assert [(r.start, r.stop, r.dropped) for r in log] == [
        (0, n, True),
        (x, n, True),
        (x, n, False),
    ]
    assert sum(r.sent for r in log) == n  # no byte was sent twice
    assert store.stats["retries"] == 2


def test_http_gives_up_naming_url_and_offset(http_server):
    root, m, _ = served_dataset(http_server, [30])
    shard = m.splits["train"].shards[0]
    x = 5000
    http_server.faults = Faults(at_byte=x, at_byte_times=100)
    store = ShardStore(root, ReadOptions(retries=2, backoff=0.001))
    with pytest.raises(ShardReadError) as info:
        store.read_ranges([(shard, 1000, 9000)])
    assert isinstance(info.value, OSError)
    assert f"{root}/train/shard-000000.tar" in str(info.value)
    assert f"byte offset {x} after 2 retries" in str(info.value)
    assert [(r.start, r.stop) for r in gets(http_server, shard)] == [(1000, 9000), (x, 9000)] + [
        (x, 9000)
    ]
    assert store.stats["retries"] == 2


def test_http_missing_or_truncated_shard_is_not_retried(http_server):
    root, m, folder = served_dataset(http_server, [30, 10])
    shards = m.splits["train"].shards
    (folder / shards[0].path).unlink()
    tar = folder / shards[1].path
    tar.write_bytes(tar.read_bytes()[:4000])
    store = ShardStore(root, ReadOptions(backoff=0))
    with pytest.raises(FileNotFoundError) as info:
        store.read_ranges([(shards[0], 0, 100)])
    assert info.value.filename == f"{root}/{shards[0].path}"
    with pytest.raises(ShardFormatError, match=r"shard-000001\.tar: truncated.*offset 4000"):
        store.read_ranges([(shards[1], 3000, 5000)])
    with pytest.raises(ShardFormatError, match=r"shard-000001\.tar: truncated.*offset 4500"):
        store.read_ranges([(shards[1], 4500, 5000)])  # HTTP 416
    assert store.stats["retries"] == 0
    assert len(gets(http_server, shards[0])) == 1


def test_remote_read_joined_copies_each_answer_into_the_callers_buffer(http_server):
    """A window read remotely is one buffer that each answer is copied into (the caller's
    when it gives one): no per-range bytes joined again once the last answer is in."""
    root, m, folder = served_dataset(http_server, [20, 13])
    shards = m.splits["train"].shards
    store = ShardStore(root, ReadOptions(max_request_bytes=4096, concurrency=3))
    # samples, then ranges that overlap them and each other, each over several requests
    reqs = sample_ranges(store, shards) + [(shards[0], 100, 9000), (shards[0], 50, 5000)]
    want = expected(folder, reqs)
    total = sum(b - a for _, a, b in reqs)
    reset_stats(store)
    out = np.zeros(total + 7, dtype=np.uint8)
    joined, pos = store.read_joined(reqs, out)
    assert isinstance(joined, np.ndarray) and np.shares_memory(joined, out)
    data = bytes(joined)
    assert [data[p : p + b - a] for p, (_, a, b) in zip(pos, reqs, strict=True)] == want
    assert store.stats["bytes_read"] == total
    assert store.stats["requests"] == pieces(reqs, 4096)  # overlaps fetched once
    alone, _ = store.read_joined(reqs)  # no buffer given: one of its own
    assert isinstance(alone, np.ndarray) and bytes(alone) == data


def test_http_requests_run_concurrently(http_server):
    root, m, folder = served_dataset(http_server, [30])
    shard = m.splits["train"].shards[0]
    # the server holds each GET until three are in flight at once; a serial reader would time out
    gate = threading.Barrier(3, timeout=20)
    http_server.faults = Faults(gate=gate)
    step = math.ceil(shard.num_bytes / 3)
    store = ShardStore(root, ReadOptions(max_request_bytes=step, concurrency=3, retries=0))
    (data,) = store.read_ranges([(shard, 0, shard.num_bytes)])
    assert data == (folder / shard.path).read_bytes()
    assert not gate.broken and len(gets(http_server, shard)) == 3


def test_http_check_shards_lists_each_folder_once(http_server):
    root, m, folder = served_dataset(http_server, [3, 3, 3, 3, 3])
    shards = m.splits["train"].shards
    store = ShardStore(root)
    http_server.clear_log()
    store.check_shards(shards)
    assert [(r.method, r.path) for r in http_server.requests()] == [("GET", "/ds/train")]
    (folder / shards[3].path).unlink()
    with pytest.raises(FileNotFoundError) as info:
        store.check_shards(shards)
    assert info.value.filename == f"{root}/{shards[3].path}"


# -- cache -----------------------------------------------------------------------------------------
def test_cache_evicts_lru_within_limit(http_server, tmp_path):
    root, m, folder = served_dataset(http_server, [40, 30, 40, 20, 40, 35])
    shards = m.splits["train"].shards
    biggest = max(s.num_bytes for s in shards)
    limit = int(2.5 * biggest)
    cache = tmp_path / "cache"
    opts = ReadOptions(cache_dir=str(cache), cache_limit_bytes=limit, max_request_bytes=16384)
    store = ShardStore(root, opts)
    peak = 0
    for _ in range(2):
        for shard in shards:
            reqs = sample_ranges(store, [shard])
            assert store.read_ranges(reqs) == expected(folder, reqs)
            peak = max(peak, folder_bytes(cache))
    assert peak <= limit + biggest
    assert store.stats["evictions"] > 0
    assert store.stats["cache_misses"] == 2 * len(shards)  # the LRU holds 2 of 6: all miss
    # the most recent shard is served from the cache: no new GET
    before = len(gets(http_server, shards[-1]))
    reqs = sample_ranges(store, [shards[-1]])
    assert store.read_ranges(reqs) == expected(folder, reqs)
    assert len(gets(http_server, shards[-1])) == before
    assert store.stats["cache_hits"] == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".wds-tmp-")]


def test_cache_evicts_the_least_recently_used_and_never_a_shard_in_use(http_server, tmp_path):
    root, m, folder = served_dataset(http_server, [20, 20, 20])
    a, b, c = m.splits["train"].shards
    cache = tmp_path / "cache"
    limit = int(2.5 * a.num_bytes)
    store = ShardStore(root, ReadOptions(cache_dir=str(cache), cache_limit_bytes=limit))
    for shard in (a, b):
        store.read_ranges([(shard, 0, 512)])
    cached = {p.name.rsplit("-", 1)[-1]: p for p in cache.iterdir() if p.suffix == ".tar"}
    os.utime(cached["000000.tar"], (1e9, 1e9))  # a is older than b ...
    os.utime(cached["000001.tar"], (1.5e9, 1.5e9))  # (both in the past)
    store.read_ranges([(a, 0, 512)])  # ... until this hit marks it used
    store.read_ranges([(c, 0, 512)])  # c needs room: b goes
    assert store.stats["evictions"] == 1
    assert cached["000000.tar"].exists() and not cached["000001.tar"].exists()
    assert [len(gets(http_server, s)) for s in (a, b, c)] == [1, 1, 1]
    # room for one and a half shards: a call reading a (cached) and b keeps a and reads b's
    # range remotely (no room to cache it): the limit holds
    small = ShardStore(
        root, ReadOptions(cache_dir=str(tmp_path / "c2"), cache_limit_bytes=a.num_bytes * 3 // 2)
    )
    small.read_ranges([(a, 0, 512)])
    out = small.read_ranges([(a, 0, 512), (b, 0, 512)])
    assert out == expected(folder, [(a, 0, 512), (b, 0, 512)])
    assert small.stats["evictions"] == 0 and small.stats["cache_hits"] == 1
    assert [len(gets(http_server, s)) for s in (a, b)] == [2, 2]  # one each for this store
    assert [p.stat().st_size for p in (tmp_path / "c2").glob("wds-*")] == [a.num_bytes]


def test_cache_evicts_only_what_no_live_reader_still_needs(http_server, tmp_path):
    root, m, folder = served_dataset(http_server, [20, 20, 20])
    a, b, c = m.splits["train"].shards
    cache = tmp_path / "cache"
    options = ReadOptions(cache_dir=str(cache), cache_limit_bytes=int(2.5 * a.num_bytes))
    store, reader = ShardStore(root, options), ShardStore(root, options)
    reader.expect_reads([(a, 0, 3), (b, 2, 9)])  # another reader's pass: a, then b until 9
    for shard in (b, a):  # b is now the least recently used
        store.read_ranges([(shard, 0, 512)])
    reader.reads_done(4)  # that reader read positions 0-3: done with a, still reads b
    assert store.read_ranges([(c, 0, 512)]) == expected(folder, [(c, 0, 512)])
    cached = sorted(p.name.rsplit("-", 1)[-1] for p in cache.glob("wds-*.tar"))
    assert cached == ["000001.tar", "000002.tar"] and store.stats["evictions"] == 1  # a went
    # every cached shard still needed (b by the reader, c by this store's next read): a's range
    # is read remotely (no room), not downloaded, and nothing is evicted
    store.expect_reads([(c, 0, 5)])
    assert store.read_ranges([(a, 0, 512)]) == expected(folder, [(a, 0, 512)])
    assert store.stats["evictions"] == 1 and gets(http_server, a)[-1].sent == 512
    assert sorted(p.name.rsplit("-", 1)[-1] for p in cache.glob("wds-*.tar")) == cached
    reader.close()  # its claims released: b may go now
    store.expect_reads([(a, 0, 5)])
    store.read_ranges([(a, 0, 512)])
    assert store.stats["evictions"] == 2 and len(gets(http_server, a)) == 3  # a downloaded
    store.close()  # claims released with the store
    assert not list(cache.glob(".wds-need-*"))


@pytest.mark.parametrize("claims", ['{"at": 0, "need": {"wds-', "[]", '{"need": 7}'])
def test_an_unreadable_claims_file_of_a_live_reader_is_ignored(
    http_server, tmp_path, caplog, claims
):
    """A live reader's claims that do not parse (written by hand, cut short) claim nothing, with
    a warning naming the file, and an unreadable peak counts as none: they raised
    JSONDecodeError/TypeError in every reader of the node that needed room."""
    import fcntl

    root, m, folder = served_dataset(http_server, [20, 20, 20])
    shards = m.splits["train"].shards
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ".wds-need-1-abc.json").write_text(claims)
    (cache / ".wds-usage.json").write_text('{"peak": null}')  # the peak: as unreadable
    fd = os.open(cache / ".wds-need-1-abc.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its reader is alive
    try:
        options = ReadOptions(
            cache_dir=str(cache), cache_limit_bytes=int(1.5 * shards[0].num_bytes)
        )
        store = ShardStore(root, options)
        for shard in shards:
            whole = [(shard, 0, shard.num_bytes)]
            assert store.read_ranges(whole) == expected(folder, whole)
        assert store.stats["evictions"] == 2
        assert f"{cache}/.wds-need-1-abc.json" in caplog.text
    finally:
        os.close(fd)


def test_a_cache_limit_below_a_shard_is_refused_naming_it(http_server, tmp_path):
    root, m, _ = served_dataset(http_server, [20])
    (a,) = m.splits["train"].shards
    limit = a.num_bytes - 1
    store = ShardStore(root, ReadOptions(cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit))
    with pytest.raises(ValueError) as err:
        store.read_ranges([(a, 0, 512)])
    assert str(err.value) == (
        f"{root}/{a.path}: shard of {a.num_bytes} bytes does not fit cache_limit_bytes={limit}; "
        "raise the limit to at least the largest shard, or read without cache_dir (ranged "
        "requests)"
    )


def test_cache_names_differ_for_equal_basenames(http_server, tmp_path):
    root_a, m_a, folder_a = served_dataset(http_server, [5], name="a")
    root_b, m_b, folder_b = served_dataset(http_server, [9], name="b")
    cache = tmp_path / "cache"
    a = ShardStore(root_a, ReadOptions(cache_dir=str(cache)))
    b = ShardStore(root_b, ReadOptions(cache_dir=str(cache)))
    sa, sb = m_a.splits["train"].shards[0], m_b.splits["train"].shards[0]
    assert sa.path == sb.path
    assert a.read_ranges([(sa, 0, sa.num_bytes)]) == [(folder_a / sa.path).read_bytes()]
    assert b.read_ranges([(sb, 0, sb.num_bytes)]) == [(folder_b / sb.path).read_bytes()]
    assert len([p for p in cache.iterdir() if p.name.endswith(".tar")]) == 2


def test_cache_redownloads_a_file_evicted_by_another_process(http_server, tmp_path):
    root, m, folder = served_dataset(http_server, [20])
    shard = m.splits["train"].shards[0]
    cache = tmp_path / "cache"
    a = ShardStore(root, ReadOptions(cache_dir=str(cache)))
    whole = [(shard, 0, shard.num_bytes)]
    assert a.read_ranges(whole) == expected(folder, whole)
    for p in cache.iterdir():  # what another worker's eviction does
        p.unlink()
    assert a.read_ranges(whole) == expected(folder, whole)
    assert a.stats["cache_misses"] == 2 and len(gets(http_server, shard)) == 2
    b = ShardStore(root, ReadOptions(cache_dir=str(cache)))  # shares the folder
    assert b.read_ranges(whole) == expected(folder, whole)
    assert b.stats["cache_hits"] == 1 and len(gets(http_server, shard)) == 2


def test_a_cached_copy_of_the_wrong_size_is_downloaded_again(http_server, tmp_path):
    """A cached copy cut short (a full disk, a partial copy of the folder) is not read: it
    gave 'truncated' errors naming the remote shard on every run; it is downloaded again."""
    root, m, folder = served_dataset(http_server, [20])
    shard = m.splits["train"].shards[0]
    cache = tmp_path / "cache"
    whole = [(shard, 0, shard.num_bytes)]
    assert ShardStore(root, ReadOptions(cache_dir=str(cache))).read_ranges(whole) == expected(
        folder, whole
    )
    (copy,) = [p for p in cache.iterdir() if p.name.endswith(".tar")]
    copy.write_bytes(copy.read_bytes()[: shard.num_bytes // 2])
    store = ShardStore(root, ReadOptions(cache_dir=str(cache)))
    assert store.read_ranges(whole) == expected(folder, whole)
    assert store.stats["cache_misses"] == 1 and len(gets(http_server, shard)) == 2
    assert copy.stat().st_size == shard.num_bytes


def test_checksums_catch_a_corrupt_shard(http_server, tmp_path):
    root, m, folder = served_dataset(http_server, [10, 10])
    good, bad = m.splits["train"].shards
    tar = folder / bad.path
    raw = bytearray(tar.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    tar.write_bytes(bytes(raw))
    cache = tmp_path / "cache"
    store = ShardStore(root, ReadOptions(cache_dir=str(cache), verify_checksum=True))
    assert store.read_ranges([(good, 0, 512)]) == expected(folder, [(good, 0, 512)])
    with pytest.raises(ShardFormatError, match=r"ds/train/shard-000001\.tar: sha256 mismatch"):
        store.read_ranges([(bad, 0, 512)])
    (cached,) = [p for p in cache.iterdir() if p.name.endswith(".tar")]  # the bad one is not
    damaged = bytearray(cached.read_bytes())
    damaged[100] ^= 0x01
    cached.write_bytes(bytes(damaged))  # a cached copy damaged on disk is caught when opened
    fresh = ShardStore(root, ReadOptions(cache_dir=str(cache), verify_checksum=True))
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar: sha256 mismatch"):
        fresh.read_ranges([(good, 0, 512)])
    assert not cached.exists()  # removed, so the next read downloads it again
    assert fresh.read_ranges([(good, 0, 512)]) == expected(folder, [(good, 0, 512)])
    uncached = ShardStore(root, ReadOptions(verify_checksum=True, max_request_bytes=4096))
    with pytest.raises(ShardFormatError, match="sha256 mismatch"):
        uncached.read_ranges([(bad, 0, 512)])
    local = ShardStore(str(folder))
    local.verify(good)
    with pytest.raises(ShardFormatError, match=rf"{tar}: sha256 mismatch"):
        local.verify(bad)
    plain = ShardStore(root)  # without verify_checksum the bytes come back as stored
    assert plain.read_ranges([(bad, 0, len(raw))]) == [bytes(raw)]
    with pytest.raises(ShardFormatError, match="sha256 mismatch"):
        plain.verify(bad)


# -- pickling into worker processes ----------------------------------------------------------------
def read_in_child(store: ShardStore, reqs: list[Req]) -> tuple[list[bytes], int]:
    """Run in a worker process: read with an unpickled store."""
    return store.read_ranges(reqs), os.getpid()


def _forked_reader(store: ShardStore, reqs: list[Req], conn) -> None:
    conn.send((store.read_ranges(reqs), store.stats["requests"]))
    conn.close()


def test_store_pickles_without_runtime_state(http_server):
    root, m, folder = served_dataset(http_server, [10, 10])
    store = ShardStore(root, ReadOptions(concurrency=2, max_request_bytes=4096))
    reqs = sample_ranges(store, m.splits["train"].shards)
    store.read_ranges(reqs)
    assert store._pool is not None and store._remote is not None
    clone = pickle.loads(pickle.dumps(store))
    assert clone._remote is None and clone._pool is None and not clone._indexes
    assert clone.stats["requests"] == 0
    assert clone.read_ranges(reqs) == expected(folder, reqs)


def test_store_works_in_a_spawned_worker(s3_bucket):
    url, opts = s3_bucket
    m = write_dataset(f"{url}/ds", {"train": [6, 4]}, storage_options=opts)
    store = ShardStore(f"{url}/ds", ReadOptions(storage_options=opts))
    reqs = sample_ranges(store, m.splits["train"].shards)
    want = store.read_ranges(reqs)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got, pid = pool.apply(read_in_child, (store, reqs))
    assert got == want and pid != os.getpid()


def test_store_used_before_fork_works_in_the_child(http_server):
    root, m, folder = served_dataset(http_server, [10, 10])
    store = ShardStore(root, ReadOptions(concurrency=2, max_request_bytes=4096))
    reqs = sample_ranges(store, m.splits["train"].shards)
    store.read_ranges(reqs)  # the parent's loop, session and threads exist now
    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_forked_reader, args=(store, reqs, child_conn), daemon=True)
    proc.start()
    try:
        assert parent_conn.poll(30), "the forked reader sent nothing"
        got, requests = parent_conn.recv()
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
    assert got == expected(folder, reqs)
    assert requests == pieces(reqs, 4096)  # counted by the child's own fresh stats


def test_a_forked_child_dropping_its_copy_of_a_filesystem_leaves_the_parent_reading(http_server):
    # fsspec's event loop is shared with a forked child through one epoll instance: the child
    # closing its inherited copy of the parent's pooled connections unregistered the parent's
    # sockets, and the parent's next request on a kept-alive connection waited for its read
    # timeout (seen as a manifest read stalling after an epoch with forked DataLoader workers)
    (http_server.root / "f.bin").write_bytes(b"x" * 1000)
    fs, path = url_to_fs(http_server.url + "/f.bin", read_timeout=2.0)
    assert fs.cat_file(path) == b"x" * 1000  # a pooled keep-alive connection now exists
    pid = os.fork()
    if pid == 0:  # the child drops every filesystem it inherited, as a DataLoader worker does
        try:
            del fs
            type(url_to_fs(http_server.url)[0]).clear_instance_cache()
            gc.collect()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    start = time.monotonic()
    assert fs.cat_file(path) == b"x" * 1000
    assert time.monotonic() - start < 1.0, "the parent's request waited for its read timeout"


# -- dead servers: bounded timeouts ----------------------------------------------------------------
FAST = {"connect_timeout": 0.5, "read_timeout": 0.5, "retries": 1, "backoff": 0.01}


@pytest.mark.parametrize("stall", ["answer", "body"])
def test_loader_over_a_server_that_stops_answering_fails_in_seconds(http_server, stall):
    """The manifest, listing and index are served; every shard GET is accepted and never
    answered (or gets its headers and no body): a ShardReadError naming the shard and the URL
    without the password, after 2 attempts of 0.5 s, not 2 x 300 s."""
    m = write_dataset(str(http_server.root / "ds"), {"train": [6]})
    root = http_server.url.replace("http://", "http://bob:s3cret-pw@") + "/ds"
    loader = create_loader(root, "train", batch_size=2, read_options=ReadOptions(**FAST))
    http_server.faults = Faults(stall=stall)
    t0 = time.monotonic()
    with pytest.raises(ShardReadError) as info:
        next(iter(loader))
    elapsed = time.monotonic() - t0
    shown = http_server.url.replace("http://", "http://***@")
    assert str(info.value).startswith(
        f"{shown}/ds/train/shard-000000.tar: read failed at byte offset 0 after 1 retries in "
    )
    assert "read_timeout=0.5s" in str(info.value) and "s3cret-pw" not in str(info.value)
    assert len(gets(http_server, m.splits["train"].shards[0])) == 2
    assert 1.0 <= elapsed < 5.0


def test_deadline_cuts_retries_and_an_attempt_in_flight(http_server):
    """read_timeout alone would allow 100 retries of 5 s: the 1.5 s deadline ends it all."""
    root, m, _ = served_dataset(http_server, [6])
    shard = m.splits["train"].shards[0]
    http_server.faults = Faults(stall="body")
    options = ReadOptions(read_timeout=5, retries=100, backoff=0.01, deadline=1.5)
    t0 = time.monotonic()
    with pytest.raises(ShardReadError, match=r"the deadline of 1\.5s reached: .*TimeoutError"):
        ShardStore(root, options).read_ranges([(shard, 0, 100)])
    assert 1.5 <= time.monotonic() - t0 < 3.0
    assert len(gets(http_server, shard)) == 1


def test_silent_server_bounds_manifest_index_checks_and_verify(http_server, tmp_path):
    """A server that accepts connections and never answers: every kind of read gives up in
    seconds (the manifest in create_loader, the index, the start-up check, checksums, the
    cache download)."""
    m = write_dataset(str(tmp_path / "ds"), {"train": [4]})
    shard = m.splits["train"].shards[0]
    with SilentServer() as silent:
        root = f"{silent.url}/ds"
        t0 = time.monotonic()
        with pytest.raises(ManifestError, match=r"/ds/manifest\.json: manifest unreadable"):
            create_loader(root, "train", batch_size=2, read_options=ReadOptions(**FAST))
        assert time.monotonic() - t0 < 3.0
        calls = {
            "index": lambda s: s.index(shard),
            "check_shards": lambda s: s.check_shards([shard]),
            "verify": lambda s: s.verify(shard),
            "cached read": lambda s: s.read_ranges([(shard, 0, 10)]),
        }
        for name, call in calls.items():
            cache = str(tmp_path / "cache") if name == "cached read" else None
            store = ShardStore(root, ReadOptions(**FAST, cache_dir=cache))
            t0 = time.monotonic()
            with pytest.raises(ShardReadError, match=r"/ds/train/\.?shard-000000\.tar"):
                call(store)
            assert time.monotonic() - t0 < 3.0, name


def test_s3_endpoint_that_never_answers_fails_in_seconds(s3_transport):
    """s3fs and botocore retry on their own (5 x 5 attempts of 15 s by default), as obstore
    does: the store turns theirs off and counts attempts itself, so 1 retry means 2
    connections; the error is a timeout with the limits that applied, with either transport."""
    pytest.importorskip("s3fs")
    shard = ShardInfo(
        path="train/shard-000000.tar",
        idx_path="train/shard-000000.tar.idx",
        num_samples=1,
        num_bytes=1024,
    )
    with SilentServer() as silent:
        options = {
            "key": "AKIAEXAMPLEKEY",
            "secret": "SECRET-never-shown",
            "client_kwargs": {"endpoint_url": silent.url},
        }
        read = ReadOptions(**FAST, storage_options=options, transport=s3_transport)
        store = ShardStore("s3://bucket/ds", read)
        t0 = time.monotonic()
        with pytest.raises(ShardReadError) as info:
            store.read_ranges([(shard, 0, 100)])
        assert time.monotonic() - t0 < 5.0
        assert silent.accepted == 2
    assert str(info.value).startswith(
        "s3://bucket/ds/train/shard-000000.tar: read failed at byte offset 0 after 1 retries"
    )
    text = str(info.value)
    assert text.endswith("(timed out: connect_timeout=0.5s, read_timeout=0.5s, deadline=60s)")
    assert "SECRET-never-shown" not in text


def test_timeouts_reach_the_http_and_s3_clients_unless_set_in_the_options():
    import aiohttp

    assert (ReadOptions().connect_timeout, ReadOptions().read_timeout) == (10.0, 20.0)
    assert ReadOptions().deadline == 60.0
    with pytest.raises(ValueError, match="must be > 0"):
        ReadOptions(read_timeout=0)
    fs, _ = url_to_fs("http://127.0.0.1:1/ds", connect_timeout=1.5, read_timeout=2.5)
    assert fs.client_kwargs["timeout"] == aiohttp.ClientTimeout(
        total=None, sock_connect=1.5, sock_read=2.5
    )
    own = aiohttp.ClientTimeout(total=7)
    fs, _ = url_to_fs("https://h/ds", {"client_kwargs": {"timeout": own}})
    assert fs.client_kwargs["timeout"] is own
    options = ReadOptions(read_timeout=3, storage_options={"config_kwargs": {"connect_timeout": 4}})
    s3 = with_timeouts("s3://b/ds", options.storage_options, read_timeout=options.read_timeout)
    assert s3["config_kwargs"] == {"connect_timeout": 4, "read_timeout": 3}
    assert options.storage_options_for("s3://b/ds")["config_kwargs"]["read_timeout"] == 3
    assert with_timeouts("memory://ds", None) == {}
