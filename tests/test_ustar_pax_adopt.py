"""Adopt's scan of one tar (:func:`build_shards.adopt.scan.scan_buffer`) on PAX shards written
the way webdataset's ShardWriter writes them: sample offsets and the end offset from tarfile,
the fixed layout, the ``.npy`` dtype and shape (kept per distinct header), and a bad ``.npy``
header refused naming the sample and field wherever it stands."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from build_shards.adopt.scan import scan_buffer
from wdsloader.errors import ShardFormatError
from wdsloader.format import padded


def _npy(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


def _shard(samples: list[dict[str, bytes]]) -> tuple[bytes, list[int], int]:
    """A PAX tar (a float mtime: a PAX header before every member), each sample's first header
    offset (tarfile's) and where the last member's data ends."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i, members in enumerate(samples):
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{i:05d}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000.5 + i
                tf.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        infos = tf.getmembers()
    starts = [m.offset for m in infos if m.name.endswith(".emb.npy")]
    return data, starts, infos[-1].offset_data + padded(infos[-1].size)


def _sample(i: int, dtype: str = "float32", rows: int = 2) -> dict[str, bytes]:
    return {
        "emb.npy": _npy(np.full((rows, 3), i, dtype=dtype)),
        "cls": str(i % 7).encode(),
        "json": b'{"i": %d}' % i + b" " * (i % 3),
    }


def test_scan_of_a_pax_shard():
    samples = [_sample(i) for i in range(40)]
    samples[30] = _sample(30, dtype="float64")  # one sample disagrees on the dtype
    samples[35] = _sample(35, rows=5)  # and one on the shape (a longer array)
    data, starts, end = _shard(samples)
    scan = scan_buffer(data, path="a.tar", source="ds/a.tar")
    assert scan.offsets.tolist() == [*starts, end]
    assert scan.num_samples == 40
    assert scan.ext_sets == {("emb.npy", "cls", "json"): [40, "00000"]}
    assert scan.npy == {"emb.npy": (None, None)}
    # the array changes size at sample 30 and the JSON varies; cls is one byte in every sample
    assert scan.layout is not None and sorted(scan.layout) == ["cls"]
    steady = scan_buffer(_shard([_sample(i) for i in range(8)])[0], path="b", source="b")
    assert steady.npy == {"emb.npy": ("float32", (2, 3))}
    assert steady.layout is not None and sorted(steady.layout) == ["cls", "emb.npy"]
    assert steady.layout["emb.npy"][1] == len(_sample(0)["emb.npy"])


def test_a_bad_npy_header_is_refused_naming_the_sample():
    samples = [_sample(i) for i in range(6)]
    bad = bytearray(samples[4]["emb.npy"])
    bad[10:14] = b"{'x"  # the header text is no longer a dict literal
    samples[4]["emb.npy"] = bytes(bad)
    data, _, _ = _shard(samples)
    with pytest.raises(ShardFormatError, match=r"^ds/a\.tar: sample '00004' field 'emb\.npy': bad"):
        scan_buffer(data, path="a.tar", source="ds/a.tar")


def test_an_empty_tar_scans_to_no_samples():
    scan = scan_buffer(b"\0" * 1024, path="e.tar", source="e.tar")
    assert scan.offsets.tolist() == [0] and scan.num_samples == 0 and scan.layout is None
