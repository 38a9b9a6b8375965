"""Every source the local engine takes, on Ray (the session's local Ray of 2 CPUs): a list
whose ``map`` does the work and a generator give the local engine's bytes, one ``ray.put`` per
block, a generator read no further ahead than the blocks in flight, an interrupted build resumed
by re-reading the generator; a failing build stops its tasks without cancelling them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from build_shards import SampleOptions, ShardOptions, build_shards
from tests.test_ray_build import Interrupt, StopAfter, local_digests, sample

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.usefixtures("infer_first_sample_only", "local_ray"),
    pytest.mark.slow,  # a Ray cluster
]

REPO = Path(__file__).resolve().parents[1]
N = 400  # 8 blocks of 50
SHARDS = ShardOptions(max_count=16, max_bytes=40_000, block_size=50)
OPTS = dict(
    splits={"train": 0.7, "val": 0.3},
    seed=3,
    shards=SHARDS,
    samples=SampleOptions(group_by="group"),
)


def urls(n: int = N) -> list[dict]:
    """Small items whose ``map`` does the work (img2dataset's pattern: URLs to fetch)."""
    return [{"__key__": f"s{i:05d}", "url": f"http://example.invalid/{i}"} for i in range(n)]


def fetch(item: dict) -> dict:
    """The heavy ``map``: the sample the URL stands for."""
    i = int(item["url"].rsplit("/", 1)[1])
    return {**sample(i), "__key__": item["__key__"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, str]:
    """The local engine's output for ``urls()`` with ``map=fetch`` and ``OPTS``."""
    out = tmp_path_factory.mktemp("ref") / "ds"
    build_shards(urls(), out, map=fetch, **OPTS)
    return local_digests(out)


@pytest.fixture(scope="module")
def gen_reference(tmp_path_factory) -> dict[str, str]:
    """The local engine's output for a generator of ``urls()`` (its manifest names the
    source an iterator)."""
    out = tmp_path_factory.mktemp("genref") / "ds"
    build_shards((u for u in urls()), out, map=fetch, **OPTS)
    return local_digests(out)


class CountPuts:
    """Counts the driver's ``ray.put`` calls."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = ray.put

        def put(value, **kw):
            self.calls += 1
            return real(value, **kw)

        monkeypatch.setattr(ray, "put", put)


def test_a_list_with_map_gives_the_local_bytes_with_one_put_per_block(
    tmp_path, reference, monkeypatch
):
    puts = CountPuts(monkeypatch)
    calls = tmp_path / "calls"
    calls.mkdir()

    def fetch_here(item: dict) -> dict:  # a closure: Ray ships it with cloudpickle
        (calls / f"{os.getpid()}-{item['__key__']}").touch()
        return fetch(item)

    m = build_shards(urls(), tmp_path / "ds", engine="ray", map=fetch_here, **OPTS)
    assert m.num_samples == N and m.build["num_blocks"] == 8
    assert local_digests(tmp_path / "ds") == reference
    assert puts.calls == 1 + 8  # the job once, then each block's items once
    here = {p.name.split("-", 1)[1] for p in calls.glob(f"{os.getpid()}-*")}
    tasks = {p.name.split("-", 1)[1] for p in calls.iterdir()} - here
    assert here == {"s00000"}  # the driver maps the first item only (for the schema)
    assert len(tasks) == N - 1 and len({p.name for p in calls.iterdir()}) >= N  # map in tasks


def test_a_generator_gives_the_local_bytes(tmp_path, gen_reference):
    m = build_shards((u for u in urls()), tmp_path / "ds", engine="ray", map=fetch, **OPTS)
    assert m.num_samples == N
    assert local_digests(tmp_path / "ds") == gen_reference


def test_a_generator_is_read_no_further_ahead_than_the_blocks_in_flight(tmp_path):
    out, block, n = tmp_path / "ds", 10, 300  # 30 blocks
    ahead: list[int] = []

    def items():
        for i, item in enumerate(urls(n)):
            if i % block == 0:
                finished = len(list((out / "_build").glob("block-*.json")))
                ahead.append(i // block - finished)  # blocks read but not finished
            yield item

    opts = {**OPTS, "shards": ShardOptions(max_count=16, max_bytes=40_000, block_size=block)}
    build_shards(items(), out, engine="ray", map=fetch, **opts)
    in_flight = 2 * 2  # INFLIGHT_PER_CPU * the cluster's CPUs
    assert len(ahead) == 30 and max(ahead) <= in_flight + 1, ahead


def test_an_interrupted_generator_build_resumes_skipping_finished_blocks(tmp_path, gen_reference):
    out = tmp_path / "ds"
    with pytest.raises(Interrupt):
        build_shards(
            (u for u in urls()), out, engine="ray", map=fetch, progress=StopAfter(100), **OPTS
        )
    kept = [int(p.stem.split("-")[1]) for p in (out / "_build").glob("block-*.json")]
    assert 2 <= len(kept) < 8 and not (out / "manifest.json").exists()
    shards = [p for b in kept for p in out.glob(f"*/*-{b:05d}-*.tar")]
    before = {p: p.stat().st_mtime_ns for p in shards}
    assert not list(out.rglob("*.tmp-*"))  # stopped tasks removed their files, and the flag

    m = build_shards((u for u in urls()), out, engine="ray", map=fetch, **OPTS)
    assert m.num_samples == N
    assert local_digests(out) == gen_reference
    assert {p: p.stat().st_mtime_ns for p in shards} == before  # kept blocks not rewritten


DRIVER = textwrap.dedent(
    """
    import sys, time, ray, torch.utils.data
    from build_shards import BuildError, ShardOptions, build_shards
    from build_shards.probe import infer

    infer.INFER_ROWS = 1  # the schema from item 0: the bad item is met in a task, not here

    address, out, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ray.init(address=address, log_to_driver=False)
    cancelled = []
    real_cancel = ray.cancel
    ray.cancel = lambda ref, **kw: (cancelled.append(ref), real_cancel(ref, **kw))

    def bad(item):  # 10 ms of work an item; item 42 (of block 4) is bad
        if item["i"] == 42:
            raise ValueError("bad item")
        time.sleep(0.01)
        return item

    class Items(torch.utils.data.Dataset):  # 40 blocks of 10
        def __len__(self):
            return 400

        def __getitem__(self, i):
            return {"i": i}

    items = Items()
    errors = set()
    for r in range(repeats):
        try:
            build_shards(items, f"{out}/ds{r}", engine="ray", map=bad,
                         shards=ShardOptions(block_size=10))
        except BuildError as exc:
            errors.add(str(exc))
    print(f"failed builds: {repeats}; cancelled tasks: {len(cancelled)}; errors: {sorted(errors)}")
    """
)


def test_failing_builds_with_tasks_in_flight_never_abort_the_driver(tmp_path):
    """A failing build stops its tasks through the abort flag, never ``ray.cancel`` (a task that
    completes while Ray 2.60 cancels it aborts the driver process): the driver, a process of its
    own on the session's Ray, survives 25 failing builds and each build leaves nothing."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    address = ray.get_runtime_context().gcs_address
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        [sys.executable, str(script), address, str(tmp_path / "out"), "25"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    error = "map failed on source item 42 (key '000000042'): ValueError: bad item"
    assert run.stdout.strip() == f"failed builds: 25; cancelled tasks: 0; errors: [{error!r}]"
    assert not list((tmp_path / "out").rglob("*.tar"))  # every failed build removed its shards
    assert not list((tmp_path / "out").rglob("abort*"))  # and its abort flag
