"""Batches checked in one pass against their layout's sample template
(:mod:`wdsloader.decode.template`): the same values as parsing every sample, and on hostile
bytes in a batch after the template was learned, the same outcome (values or the error naming
shard, key and field) as the full checks give."""

from __future__ import annotations

import re

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from tests.hostile_tar import with_checksum
from wdsloader import create_loader
from wdsloader.decode import template
from wdsloader.errors import WdsLoaderError
from wdsloader.format import BLOCK, Manifest, decode_index, index_path, iter_members

N, BATCH = 192, 16
HOSTILE = 100  # the sample made hostile: in batch 6, long after the template was learned


def _rows():
    for i in range(N):
        yield {
            "__key__": f"s{i:05d}",
            "emb": np.full(8, i, np.float32),
            "neg": np.full((2, 8), -i, np.float32),
            "label": i,  # a running index: 1-3 digits
            "meta": {"i": i, "pad": "p" * (i % 11)},
        }


def _built(tmp_path):
    root = str(tmp_path / "ds")
    build_shards(list(_rows()), root, shards=ShardOptions(max_count=64))
    return root


def _epoch(root, batch_size=BATCH, **kwargs):
    """Every batch (as plain values), or the error that ended the epoch."""
    loader = create_loader(root, "train", batch_size, shuffle=False, **kwargs)
    out = []
    try:
        for b in loader:
            out.append({k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()})
    except WdsLoaderError as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.fixture
def counted(monkeypatch):
    """The batches read by a template (``read`` calls that gave a batch)."""
    hits = []
    real = template.SampleTemplate.read

    def read(self, *args):
        got = real(self, *args)
        hits.append(got is not None)
        return got

    monkeypatch.setattr(template.SampleTemplate, "read", read)
    return hits


def _without_templates(root, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(template.Templates, "read", lambda self, raw: None)
        return _epoch(root)


def test_batches_after_the_first_are_read_by_the_template(tmp_path, counted):
    root = _built(tmp_path)
    fast = _epoch(root)
    # the first batch of each walk start teaches (and checks itself), every later one is read
    assert sum(counted) >= N // BATCH - 1 and all(counted)
    assert fast == _epoch(root, gather=False)
    assert [m["i"] for b in fast for m in b["meta"]] == list(range(N))


def _patch_member(root, sample, ext, patch):
    """Apply ``patch(shard bytes, header offset)`` to the ``ext`` member header of sample
    ``sample`` of the split, its checksum recomputed unless ``patch`` says no."""
    shards = Manifest.load(root).split("train").shards
    path = f"{root}/{shards[sample // 64].path}"
    sample %= 64
    with open(path, "rb") as f:
        idx = decode_index(open(index_path(path), "rb").read())
        data = bytearray(f.read())
    (member,) = [
        m
        for m in iter_members(bytes(data), int(idx[sample]), int(idx[sample + 1]))
        if m.name.endswith(ext)
    ]
    at = member.data_offset - BLOCK
    if patch(data, at) is not False:
        data[at : at + BLOCK] = with_checksum(data[at : at + BLOCK])
    with open(path, "wb") as f:
        f.write(data)


def _mtime(data, at):
    data[at + 140] ^= 0x01


def _size(data, at):
    data[at + 134] += 1  # the size field's last digit: one byte more


def _name(data, at):
    data[at + 5] = ord("9")  # another key


def _checksum(data, at):
    data[at + 150] ^= 0x01
    return False


def _npy(data, at):
    data[at + BLOCK + 8 + 2 + 12] ^= ord("<") ^ ord(">")  # "'descr': '<f4'" -> '>f4'


def _cls_width(data, at):
    # "150" -> "15\0" with size 2 in a shard whose layout fixes .cls at 3 bytes: the walk
    # reads the member's own size (a decoded field, not gathered), so does the template
    data[at + 135 - 1] -= 1
    data[at + BLOCK + 2] = 0


def _size_digit(data, at):
    data[at + 124] = ord("8")  # not an octal digit: only the full parser reads it (or not)


def _npy_padding(data, at):
    # a space of the .npy header's padding (before its newline) made another byte
    end = data.index(b"\n", at + BLOCK)
    data[end - 1] = ord("x")
    return False  # the member header is untouched


def _npy_data(data, at):
    # the first byte of the array data, in the block that starts with the .npy header
    data[at + BLOCK + 128] ^= 0x40
    return False


CASES = {
    "mtime": ("emb.npy", _mtime),
    "size": ("neg.npy", _size),
    "name": ("emb.npy", _name),
    "checksum": ("neg.npy", _checksum),
    "npy": ("emb.npy", _npy),
    "cls_width": ("label.cls", _cls_width),  # read by the template: see below
    "json_checksum": ("meta.json", _checksum),
    "cls_size_digit": ("label.cls", _size_digit),
    "json_name": ("meta.json", _name),  # a later member named with another key
    "npy_padding": ("neg.npy", _npy_padding),
    "npy_data": ("emb.npy", _npy_data),  # array data: read by the template, as it is
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_sample_after_the_template_gives_the_full_checks_outcome(
    tmp_path, monkeypatch, counted, case
):
    root = _built(tmp_path)
    ext, patch = CASES[case]
    _patch_member(root, 150 if case == "cls_width" else HOSTILE, ext, patch)
    fast = _epoch(root)
    assert any(counted)
    if case == "cls_width":
        assert all(counted) and fast[150 // BATCH]["label"][150 % BATCH] == 15
    elif case == "npy_data":
        assert all(counted) and fast[HOSTILE // BATCH]["emb"][HOSTILE % BATCH][0] != HOSTILE
    else:
        assert not all(counted)  # the hostile batch went to the full checks
    assert fast == _without_templates(root, monkeypatch)
    if isinstance(fast[-1], str):  # an error: it names the shard and the sample
        assert re.search(r"train-\d+-\d+\.tar", fast[-1]), fast[-1]
    else:
        assert fast == _epoch(root, gather=False)


def _mode_same_sum(data, at):
    # the mode field's "0000644" made "0000653": another header, the same byte sum, so its
    # checksum still holds (only the comparison with the template's bytes sees it)
    assert data[at + 104 : at + 107] == b"644"
    data[at + 105] += 1
    data[at + 106] -= 1
    return False


@pytest.mark.parametrize("patch", [_mode_same_sum, _npy_padding])
@pytest.mark.parametrize("sample", [100, 130, 143])  # in the batch's first chunk, its tail, last
def test_a_hostile_sample_anywhere_in_a_batch_longer_than_a_chunk_is_caught(
    tmp_path, monkeypatch, counted, sample, patch
):
    """Batches of 48 samples: one chunk of :data:`template.CHUNK` compared, then the rest."""
    assert template.CHUNK < 48 < 2 * template.CHUNK
    root = _built(tmp_path)
    _patch_member(root, sample, "neg.npy", patch)
    fast = _epoch(root, batch_size=48)
    assert counted.count(False) == 1  # the hostile batch (96-143) alone took the full checks
    with monkeypatch.context() as m:
        m.setattr(template.Templates, "read", lambda self, raw: None)
        assert fast == _epoch(root, batch_size=48)
    assert fast == _epoch(root, batch_size=48, gather=False)
