"""create_loader(packing=Packing(...)) through the real loader: fixed-shape packed batches in
which every document of the epoch comes exactly once (a split document's pieces each once),
with 2 DataLoader workers and 2 ranks (in one process, and under torchrun with gloo), equal
batch counts per rank, exact and elastic resume, and clear errors.

Its ``scenario`` runs under torchrun in the launch that the tests under DDP share
(tests/ddp_launch.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.http_server import http_server_fixture  # noqa: F401

MAX_TOKENS = 48
N_DOCS = 160


def _length(i: int) -> int:
    return 1 + (i * 37) % 29 + (i % 7 == 0) * 70  # 1 .. 99: every 7th over MAX_TOKENS


def _tokens(i: int) -> np.ndarray:
    return ((np.arange(_length(i)) * 7 + i) % 997 + 1).astype(np.int32)


def _build(out: Path, lengths: str | None = "input_ids", meta: bool = False) -> None:
    from build_shards import SampleOptions, ShardOptions, build_shards

    samples = [{"__key__": f"d{i:04d}", "input_ids": _tokens(i)} for i in range(N_DOCS)]
    if meta:
        samples = [{**s, "meta": {"doc": i}} for i, s in enumerate(samples)]
    build_shards(
        samples, out, splits={"train": 1.0}, shards=ShardOptions(max_count=40),
        samples=SampleOptions(lengths=lengths),
    )  # fmt: skip


def _loader(data: Path, **kw):
    from wdsloader import Packing, create_loader

    kw.setdefault("packing", Packing(max_tokens=MAX_TOKENS, window=32))
    return create_loader(str(data), "train", kw.pop("batch_size", 3), seed=4, **kw)


def _docs(batches: list[dict]) -> dict[int, list[int]]:
    """Each document's tokens over the batches' distinct rows (by split index: a row repeated
    to pad the last round counts once; no two planned rows are alike), and the batches'
    checks."""
    out: dict[int, list[int]] = defaultdict(list)
    rows: set[tuple[int, ...]] = set()
    for b in batches:
        ids, doc_ids, labels = b["input_ids"], b["document_ids"], b["labels"]
        assert ids.shape == (3, MAX_TOKENS) and doc_ids.shape == ids.shape
        starts = b["position_ids"] == 0
        assert torch.all(labels[(doc_ids < 0) | starts] == -100)
        assert torch.equal(labels[(doc_ids >= 0) & ~starts], ids[(doc_ids >= 0) & ~starts])
        for row_docs, row_ids in zip(doc_ids.tolist(), ids.tolist(), strict=True):
            if tuple(row_docs + row_ids) in rows:
                continue
            rows.add(tuple(row_docs + row_ids))
            for d, t in zip(row_docs, row_ids, strict=True):
                if d >= 0:
                    out[d].append(t)
    return out


def _assert_exactly_once(docs: dict[int, list[int]], keys: dict[int, int]) -> None:
    assert sorted(docs) == sorted(keys)
    for d, tokens in docs.items():
        assert sorted(tokens) == sorted(_tokens(keys[d]).tolist()), d


def _keys(data: Path) -> dict[int, int]:
    """Split index -> the document's number (from its key)."""
    from wdsloader import ShardDataset

    ds = ShardDataset(str(data), "train")
    return {i: int(ds[i]["__key__"][1:]) for i in range(len(ds))}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "ds"
    _build(out)
    return out


def test_two_workers_yield_every_document_once_in_fixed_shape_rows(data) -> None:
    loader = _loader(data, num_workers=2, drop_last=False)
    padding, n = loader.padding, len(loader)  # of epoch 0 (iterating moves to epoch 1)
    batches = list(loader)
    assert len(batches) == n and loader.dropped == 0
    docs = _docs(batches)
    _assert_exactly_once(docs, _keys(data))
    rows = {
        (tuple(d), tuple(r))
        for b in batches
        for d, r in zip(b["document_ids"].tolist(), b["input_ids"].tolist(), strict=True)
    }
    assert len(rows) == len(batches) * 3 - padding
    assert loader.batch_indices(0, 1).index.tolist() == batches[1]["__index__"].tolist()


def test_two_ranks_get_equal_batches_and_every_document_once(data) -> None:
    from wdsloader import Topology

    per_rank = [
        list(_loader(data, num_workers=2, topology=Topology(rank=r, world_size=2)))
        for r in range(2)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) > 0
    docs = _docs(per_rank[0] + per_rank[1])
    assert all(len(v) > 0 for v in docs.values())
    left_out = _loader(data, topology=Topology(rank=0, world_size=2)).dropped
    assert left_out < 2 * 3
    keys = _keys(data)
    if left_out == 0:
        _assert_exactly_once(docs, keys)
    else:  # the documents of the rows left out are not read; none is read twice
        for d, tokens in docs.items():
            assert len(tokens) <= _length(keys[d])


def test_exact_and_elastic_resume(data) -> None:
    from wdsloader import Topology

    full = list(_loader(data, num_workers=2, drop_last=False))
    loader = _loader(data, num_workers=2, drop_last=False)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 5:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    again = _loader(data, num_workers=2, drop_last=False)
    again.load_state_dict(state)
    tail = list(again)
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert torch.equal(a["document_ids"], b["document_ids"])
    # elastic: two ranks of one worker continue with the packs not yet consumed
    rest = []
    for r in range(2):
        other = _loader(data, drop_last=False, topology=Topology(rank=r, world_size=2))
        other.load_state_dict(state)
        rest.append(list(other))
    assert len(rest[0]) == len(rest[1])
    docs = _docs(head + rest[0] + rest[1])
    _assert_exactly_once(docs, _keys(data))


def test_a_state_of_another_packing_or_none_is_refused(data) -> None:
    from wdsloader import DecodeOptions, Packing, StateMismatchError

    decode = DecodeOptions(collate_options={"max_tokens": MAX_TOKENS})
    plain = _loader(data, packing=None, collate_fn="packed", decode=decode)
    state = plain.state_dict()
    with pytest.raises(StateMismatchError, match="packing"):
        _loader(data).load_state_dict(state)
    other = _loader(data, packing=Packing(max_tokens=MAX_TOKENS + 1, window=32))
    with pytest.raises(StateMismatchError, match="max_tokens=48"):
        other.load_state_dict(_loader(data).state_dict())


def test_errors_name_the_field_and_the_shard(data, tmp_path) -> None:
    from wdsloader import Packing
    from wdsloader.errors import ShardFormatError

    bare = tmp_path / "bare"
    _build(bare, lengths=None)
    with pytest.raises(ShardFormatError, match=r"lengths of 'input_ids' recorded.*none"):
        _loader(bare)
    with pytest.raises(
        ValueError,
        match=r"shard train/train-00000-000\.tar: sample #0 has 71 tokens of 'input_ids'",
    ):
        _loader(data, packing=Packing(max_tokens=MAX_TOKENS, too_long="error"))
    with pytest.raises(ValueError, match="collate_fn='default' would be unused"):
        _loader(data, collate_fn="default")


def test_a_document_longer_than_its_recorded_length_is_refused(tmp_path) -> None:
    """Shards changed after their lengths were recorded (a sample now longer): the plan packs
    only the recorded tokens, and the rest of the document was silently left out."""
    from build_shards import SampleOptions, ShardOptions, build_shards
    from wdsloader import Packing

    def build(out: Path, long: int) -> None:
        docs = [{"__key__": f"d{i}", "input_ids": _tokens(i)[:5]} for i in range(8)]
        docs[3]["input_ids"] = _tokens(3)[:long]
        build_shards(
            docs, out, splits={"train": 1.0}, shards=ShardOptions(max_count=40),
            samples=SampleOptions(lengths="input_ids"),
        )  # fmt: skip

    build(tmp_path / "recorded", 4)
    build(tmp_path / "now", 9)
    shard = "train/.train-00000-000.tar.wdslen"
    (tmp_path / "now" / shard).write_bytes((tmp_path / "recorded" / shard).read_bytes())
    sha = {d: json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("recorded", "now")}
    text = (tmp_path / "now" / "manifest.json").read_text()
    old, new = (
        sha[d]["splits"]["train"]["shards"][0]["lengths_sha256"] for d in ("now", "recorded")
    )
    (tmp_path / "now" / "manifest.json").write_text(text.replace(old, new))
    loader = _loader(tmp_path / "now", packing=Packing(max_tokens=16, window=8), batch_size=1)
    with pytest.raises(
        ValueError,
        match=r"sample 'd3' .* has 9 tokens in 'input_ids', but the plan packs its tokens up to 4",
    ):
        list(loader)


def test_collate_options_reach_the_packed_collator(data) -> None:
    from wdsloader import DecodeOptions

    decode = DecodeOptions(collate_options={"pad_id": 7, "labels": False})
    batch = next(iter(_loader(data, decode=decode)))
    assert "labels" not in batch
    assert torch.all(batch["input_ids"][batch["document_ids"] < 0] == 7)
    assert bool((batch["document_ids"] < 0).any())


def test_skipped_documents_become_padding_and_batches_keep_their_shape(data, tmp_path) -> None:
    from wdsloader import ErrorPolicy

    root = tmp_path / "ds"
    _build(root, meta=True)
    bad = {3, 4, 50, 51, 52}
    for shard in sorted((root / "train").glob("*.tar")):
        raw = bytearray(shard.read_bytes())
        for i in bad:
            at = raw.find(b'{"doc":%d}' % i)
            if at >= 0:
                raw[at] ^= 0xFF  # its JSON no longer decodes; sizes and offsets stay
        shard.write_bytes(bytes(raw))
    loader = _loader(root, num_workers=2, drop_last=False, errors=ErrorPolicy(on_error="skip"))
    n = len(loader)
    batches = list(loader)
    assert len(batches) == n and loader.stats["skipped_samples"] == len(bad)
    docs = _docs(batches)
    keys = _keys(data)  # the same documents in the same order, without the damage
    assert {keys[d] for d in docs} == set(range(N_DOCS)) - bad
    _assert_exactly_once(docs, {d: keys[d] for d in docs})


# ----------------------------------------------------------------------- under torchrun
PHASES = ("first",)


def prepare(folder: Path) -> None:
    _build(folder / "ds")


def scenario(folder: Path, phase: str) -> None:
    """This rank's epoch (in the process group torchrun started); rank 0 writes every rank's
    report to ``folder/{phase}.json``."""
    import torch.distributed as dist

    loader = _loader(folder / "ds", num_workers=2, distributed=True, drop_last=True)
    seen = [[b["document_ids"].tolist(), b["input_ids"].tolist(), loader.dropped] for b in loader]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"len": len(loader), "seen": seen})
    if dist.get_rank() == 0:
        (folder / f"{phase}.json").write_text(json.dumps(gathered))


@pytest.mark.slow
def test_torchrun_two_ranks_two_workers(data, ddp_reports) -> None:
    # the launch's dataset is built as ``data`` is (the same documents, keys and shards)
    ranks = ddp_reports[__name__]
    assert ranks[0]["len"] == ranks[1]["len"] == len(ranks[0]["seen"]) == len(ranks[1]["seen"])
    docs: dict[int, list[int]] = defaultdict(list)
    for r in ranks:
        for doc_ids, ids, _ in r["seen"]:
            for d, t in zip(np.ravel(doc_ids).tolist(), np.ravel(ids).tolist(), strict=True):
                if d >= 0:
                    docs[d].append(t)
    keys = _keys(data)
    dropped = ranks[0]["seen"][0][2] if ranks[0]["seen"] else 0
    for d, tokens in docs.items():  # no document twice across ranks
        assert len(tokens) <= _length(keys[d])
    if dropped == 0:
        _assert_exactly_once(docs, keys)
    else:
        assert len(docs) < len(keys)


def test_a_dropped_lengths_read_is_retried_through_the_store(http_server):
    """The plan's lengths come through the dataset's store (its retries, deadline and cache),
    not a bare filesystem read: a GET of a ``.wdslen`` cut short is retried."""
    from tests.http_server import Faults
    from wdsloader.io import ReadOptions

    _build(http_server.root / "ds")
    http_server.faults = Faults(first_gets=1, suffix=".wdslen")
    loader = _loader(f"{http_server.url}/ds", read_options=ReadOptions(backoff=0))
    gets = [r for r in http_server.requests() if r.path.endswith(".wdslen")]
    assert [r.dropped for r in gets][:2] == [True, False]
    assert sum(len(b["input_ids"]) for b in loader) == len(loader) * 3
