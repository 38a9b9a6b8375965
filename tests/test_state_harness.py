"""One save/load-state harness (torchdata's ``run_test_save_load_state`` idea) applied to every
loader configuration: a state taken after any number of batches, saved and loaded into a new
loader (as after a process restart), continues with exactly the batches that followed.

States travel as a checkpoint would: ``torch.save``/``torch.load(weights_only=True)`` (what the
training loop of docs/loading.md and ``examples/ddp_train.py`` do) and
``json.dumps``/``json.loads`` (a state is plain JSON data); the harness resumes from both.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import new_bucket
from tests.dataset_factory import write_dataset
from tests.http_server import RangeHTTPServer
from tests.test_curriculum_loader import CURR, write_curriculum_dataset
from tests.test_loader_skip import corrupt_meta
from wdsloader import ReadOptions, WdsDataLoader, create_loader, set_epoch

ROOT = Path(__file__).resolve().parents[1]  # the repository (for a subprocess)
COUNTS = [37, 50, 13, 44, 29]  # 173 samples in unequal shards
BATCH = 8
BAD = [3, 40, 41, 120]  # samples whose meta.json no longer decodes (on_error="skip")
REMOTE_COUNTS = [30, 21, 25]  # 76 samples: remote reads cost a round trip each
REMOTE_READS = ReadOptions(connect_timeout=5, read_timeout=5, deadline=30)  # fail fast


# -- the harness --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """Take the state after ``batches`` batches of the stream, inside the training loop (right
    after the batch) or, at an epoch's end, ``after_loop`` (once the loop over the epoch ended)."""

    batches: int
    after_loop: bool = False

    def __str__(self) -> str:
        return f"after {self.batches} batches" + (
            " (after the epoch loop)" if self.after_loop else ""
        )


def snapshot(batch: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``batch`` that later batches cannot change (tensors cloned)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def play(
    loader: WdsDataLoader,
    start_epoch: int,
    epochs: int,
    stop: Checkpoint | None = None,
    set_first: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Epochs ``start_epoch .. epochs-1`` of ``loader`` as a training loop plays them
    (``set_epoch`` before each, not before the first when ``set_first`` is False); with ``stop``,
    ends there and returns the state taken at that point."""
    got: list[dict[str, Any]] = []
    for epoch in range(start_epoch, epochs):
        if epoch > start_epoch or set_first:
            set_epoch(loader, epoch)
        if stop is not None and stop.batches == len(got) and not stop.after_loop:
            return got, loader.state_dict()
        for batch in loader:
            got.append(snapshot(batch))
            if stop is not None and stop.batches == len(got) and not stop.after_loop:
                return got, loader.state_dict()
        if stop is not None and stop.batches == len(got):
            return got, loader.state_dict()
    assert stop is None, f"the stream ended before the checkpoint {stop}"
    return got, None


def round_trip(state: dict[str, Any], codec: str) -> dict[str, Any]:
    """``state`` after a trip through a checkpoint file (``torch`` or ``json``)."""
    if codec == "json":
        return json.loads(json.dumps(state))
    buf = io.BytesIO()
    torch.save({"loader": state}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["loader"]
    assert loaded == state
    return loaded


def assert_same_stream(got: list[dict], ref: list[dict], start: int, what: str) -> None:
    """``got`` is ``ref`` exactly: batch count, keys, every field (tensor dtype, shape, values)."""
    for i, (a, b) in enumerate(zip(got, ref, strict=False)):
        where = f"{what}: batch {start + i} of the stream"
        assert a["__key__"] == b["__key__"], f"{where}: keys differ"
        assert a.keys() == b.keys(), f"{where}: fields differ"
        for name, value in b.items():
            other = a[name]
            if isinstance(value, torch.Tensor):
                assert isinstance(other, torch.Tensor), f"{where}: field {name!r} not a tensor"
                assert other.dtype == value.dtype and other.shape == value.shape, (
                    f"{where}: field {name!r} is {other.dtype}{list(other.shape)}, "
                    f"expected {value.dtype}{list(value.shape)}"
                )
                assert torch.equal(other, value), f"{where}: field {name!r} values differ"
            else:
                assert other == value, f"{where}: field {name!r} differs"
    assert len(got) == len(ref), f"{what}: {len(got)} batches, expected {len(ref)}"


def default_checkpoints(per_epoch: int) -> list[Checkpoint]:
    """Start, first batch, mid-epoch, the epoch's last batch (inside the loop, and after it
    ended), and the next epoch's first batch."""
    n = per_epoch
    ks = [0, 1, n // 2, n, n + 1]
    return [*(Checkpoint(k) for k in ks), Checkpoint(n, after_loop=True)]


def few_checkpoints(per_epoch: int) -> list[Checkpoint]:
    """For remote stores (a round trip per read): one batch in, one batch into the next epoch."""
    return [Checkpoint(1), Checkpoint(per_epoch + 1)]


def check_save_load(
    make_loader: Callable[[], WdsDataLoader],
    epochs: int = 2,
    checkpoints: Callable[[int], list[Checkpoint]] = default_checkpoints,
) -> list[dict[str, Any]]:
    """Check that ``make_loader()``'s loaders resume exactly; returns the reference stream.

    Records the reference (``epochs`` epochs with ``set_epoch``); for each checkpoint, plays a
    fresh loader up to it, saves its state (alternately through ``torch.save`` and JSON), loads
    it into another fresh loader and checks that the rest of the stream, epoch boundary
    included, equals the reference batch for batch. ``len(loader)`` is the batches of each
    epoch, before and after loading. One checkpoint is resumed twice (a chain of restarts).
    ``checkpoints`` gives the checkpoints from the batches per epoch.
    """
    ref_loader = make_loader()
    per_epoch = len(ref_loader)
    reference: list[dict[str, Any]] = []
    for epoch in range(epochs):
        batches, _ = play(ref_loader, epoch, epoch + 1)
        assert len(batches) == per_epoch, f"epoch {epoch}: {len(batches)} batches, len {per_epoch}"
        reference += batches
    assert per_epoch > 2, "the harness needs epochs of several batches"
    assert len(ref_loader) == per_epoch

    for i, cp in enumerate(checkpoints(per_epoch)):
        codec = "json" if i % 2 else "torch"
        first = make_loader()
        head, state = play(first, 0, epochs, stop=cp)
        assert_same_stream(head, reference[: cp.batches], 0, f"before the checkpoint {cp}")
        resumed = make_loader()
        resumed.load_state_dict(round_trip(state, codec))
        assert len(resumed) == per_epoch
        # docs/loading.md's loop calls set_epoch(start_epoch) first; a loader may also just go on
        rest, _ = play(resumed, state["epoch"], epochs, set_first=bool(i % 2))
        what = f"resumed from the state {cp} (via {codec})"
        assert_same_stream(rest, reference[cp.batches :], cp.batches, what)
        assert len(resumed) == per_epoch

    # a chain: resume mid-epoch, play into the next epoch, save again, resume again
    mid = per_epoch // 2
    first = make_loader()
    _, state = play(first, 0, epochs, stop=Checkpoint(mid))
    second = make_loader()
    second.load_state_dict(round_trip(state, "torch"))
    more = per_epoch - mid + 1
    _, state = play(second, state["epoch"], epochs, stop=Checkpoint(more))
    third = make_loader()
    third.load_state_dict(round_trip(state, "json"))
    rest, _ = play(third, state["epoch"], epochs)
    assert_same_stream(rest, reference[mid + more :], mid + more, "resumed twice")
    return reference


# -- datasets (one of each per module) ----------------------------------------------------------
@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("harness") / "plain"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


@pytest.fixture(scope="module")
def curriculum(tmp_path_factory) -> str:
    """Three stored variants per sample plus a zero one; the manifest's default curriculum."""
    return write_curriculum_dataset(tmp_path_factory.mktemp("harness") / "curr", COUNTS, CURR)


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("harness") / "corrupt"
    write_dataset(str(root), {"train": COUNTS})
    corrupt_meta(root, "train", BAD)
    return str(root)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness") / "www"
    write_dataset(str(root / "ds"), {"train": REMOTE_COUNTS})
    with RangeHTTPServer(root) as server:
        yield f"{server.url}/ds", None


@pytest.fixture(scope="module")
def s3(s3_server):
    bucket, options = new_bucket(s3_server, "harness")
    write_dataset(f"{bucket}/ds", {"train": REMOTE_COUNTS}, options)
    return f"{bucket}/ds", options


W2 = {"num_workers": 2}
CONFIGS = {
    "workers0": ("plain", {}),
    "workers2": ("plain", W2),
    "workers2-persistent": ("plain", {**W2, "persistent_workers": True}),
    "workers0-no-shuffle-keep-last": ("plain", {"shuffle": False, "drop_last": False}),
    "workers2-keep-last": ("plain", {**W2, "drop_last": False}),
    "workers0-no-gather": ("plain", {"gather": False}),
    "workers2-no-gather-keep-last": ("plain", {**W2, "gather": False, "drop_last": False}),
    "curriculum-workers0": ("curriculum", {}),
    "curriculum-workers2-persistent": ("curriculum", {**W2, "persistent_workers": True}),
    "curriculum-no-gather-workers2": ("curriculum", {**W2, "gather": False}),
    "curriculum-off-workers2": ("curriculum", {**W2, "curriculum": False}),
    "skip-corrupt-workers0": ("corrupt", {"on_error": "skip"}),
    "skip-corrupt-workers2-no-gather": ("corrupt", {**W2, "on_error": "skip", "gather": False}),
    "http-workers0": ("http", {"drop_last": False}),
    "http-workers2": ("http", {**W2, "drop_last": False}),
    "s3-workers0": ("s3", {}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_configuration_resumes_exactly(name, request):
    fixture, kwargs = CONFIGS[name]
    data = request.getfixturevalue(fixture)
    url, options = data if isinstance(data, tuple) else (data, None)
    kw = {"batch_size": BATCH, "seed": 3, **kwargs}
    checkpoints = default_checkpoints
    if fixture in ("http", "s3"):
        kw.update(storage_options=options, read_options=REMOTE_READS)
        checkpoints = few_checkpoints
    reference = check_save_load(lambda: create_loader(url, "train", **kw), checkpoints=checkpoints)
    if fixture == "curriculum" and kwargs.get("curriculum") is not False:
        assert "steering" in reference[0] and "steer_a" not in reference[0]
    if fixture == "corrupt":  # the skipped samples are really absent
        seen = {k for b in reference for k in b["__key__"]}
        assert not seen & {f"train{i:07d}" for i in BAD}


def test_the_harness_sees_a_loader_that_ignores_its_state(plain):
    def make():
        loader = create_loader(plain, "train", batch_size=BATCH)
        loader.load_state_dict = lambda state: None  # resumes from the epoch's start
        return loader

    with pytest.raises(AssertionError, match=r"resumed from the state after 1 batches"):
        check_save_load(make, checkpoints=lambda n: [Checkpoint(1)])


# -- elastic: another world size ----------------------------------------------------------------
def keys_of(batches):
    return [k for b in batches for k in b["__key__"]]


@pytest.mark.parametrize("new_world", [1, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_two_rank_state_resumed_at_another_world_size_delivers_the_rest_once(
    plain, new_world, workers
):
    kw = {"batch_size": BATCH, "drop_last": False, "seed": 3}
    old = [create_loader(plain, "train", rank=r, world_size=2, **kw) for r in range(2)]
    stop = len(old[0]) // 2
    consumed = []
    states = []
    for ld in old:
        got, state = play(ld, 0, 1, stop=Checkpoint(stop))
        consumed += keys_of(got)
        states.append(round_trip(state, "torch"))
    assert states[0] == states[1]  # the ranks' states agree; any one resumes all
    rest = []
    lengths = set()
    for r in range(new_world):
        ld = create_loader(plain, "train", rank=r, world_size=new_world, num_workers=workers, **kw)
        ld.load_state_dict(states[r % 2])
        got, _ = play(ld, 0, 1)
        lengths.add(len(got))
        rest += keys_of(got)
    assert len(lengths) == 1, f"ranks yield {sorted(lengths)} batches"
    everything = {f"train{i:07d}" for i in range(sum(COUNTS))}
    assert not set(consumed) & set(rest), "a consumed sample came again"
    assert set(consumed) | set(rest) == everything, "a sample was lost"
    assert len(consumed) == 2 * stop * BATCH
    assert len(consumed) - len(set(consumed)) < 2 * BATCH  # only the old plan's padding repeats
    repeats = sum(c - 1 for c in Counter(rest).values())
    assert repeats < new_world * BATCH  # only the new plan's padding repeats
