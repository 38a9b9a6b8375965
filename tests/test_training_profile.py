"""profile_dataloader: exact numbers on a fake clock (load and step costs known), replay mode,
real loaders, and the errors."""

from __future__ import annotations

import pytest
import torch

import wdsloader.training.profile as profile_mod
from wdsloader.training import (
    DataLoaderConfig,
    DataLoaderFactory,
    ProfileResult,
    profile_dataloader,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TimedLoader:
    """Yields ``n`` batches of 4 samples; each takes ``cost`` seconds of the fake clock."""

    def __init__(self, clock: Clock, n: int, cost: float) -> None:
        self.clock, self.n, self.cost, self.reads = clock, n, cost, 0

    def __iter__(self):
        for i in range(self.n):
            self.clock.t += self.cost
            self.reads += 1
            yield {"x": torch.full((4, 2), float(i))}


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(profile_mod.time, "perf_counter", c)
    return c


def test_exact_numbers_with_a_step(clock):
    loader = TimedLoader(clock, n=10, cost=0.01)

    def step(batch):
        clock.t += 0.03

    r = profile_dataloader(loader, num_batches=5, step_fn=step)
    assert isinstance(r, ProfileResult) and not r.replay
    assert (r.batches, r.samples) == (5, 20)
    assert r.seconds == pytest.approx(0.2)
    assert r.samples_per_s == pytest.approx(100.0) and r.batches_per_s == pytest.approx(25.0)
    assert r.time_to_first_batch_s == pytest.approx(0.01)
    assert r.wait_p50_s == pytest.approx(0.01) and r.wait_p95_s == pytest.approx(0.01)
    assert r.wait_share == pytest.approx(0.04 / 0.19)
    assert "waiting 21.1% of the time" in r.summary()


def test_without_step_no_wait_share_and_short_loader(clock):
    r = profile_dataloader(TimedLoader(clock, n=3, cost=0.5), num_batches=100)
    assert (r.batches, r.samples, r.wait_share) == (3, 12, None)
    assert r.seconds == pytest.approx(1.5) and r.time_to_first_batch_s == pytest.approx(0.5)


def test_replay_leaves_loading_out(clock):
    loader = TimedLoader(clock, n=50, cost=0.01)

    def step(batch):
        clock.t += 0.03

    r = profile_dataloader(loader, num_batches=20, step_fn=step, replay=True)
    assert r.replay and loader.reads == 8  # the first 8 batches, read before timing
    assert (r.batches, r.samples) == (20, 80)
    assert r.seconds == pytest.approx(0.6) and r.wait_share == pytest.approx(0.0)
    assert r.summary().startswith("replay: ")


def test_errors():
    with pytest.raises(ValueError, match="num_batches must be a positive integer"):
        profile_dataloader([], num_batches=0)
    with pytest.raises(TypeError, match="cannot tell the number of samples"):
        profile_dataloader([3], num_batches=1)


def test_real_loader_on_a_device():
    loader = DataLoaderFactory().create_dataloader(
        [torch.tensor([float(i)]) for i in range(40)], DataLoaderConfig(batch_size=8, num_workers=0)
    )
    seen = []
    r = profile_dataloader(loader, num_batches=3, step_fn=seen.append, device="cpu")
    assert (r.batches, r.samples, len(seen)) == (3, 24, 3)
    assert seen[0][0].device.type == "cpu" and r.seconds > 0 and 0 <= r.wait_share <= 1
    assert set(r.to_dict()) >= {"samples_per_s", "batches_per_s", "wait_p95_s", "wait_share"}
