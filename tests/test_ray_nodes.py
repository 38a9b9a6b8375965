"""Two Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head and a second node with
their own raylets and object stores) writing to S3 (moto): the second node is killed mid-build,
its tasks are retried on the head, and the output is the local engine's, nothing lost or
doubled."""

from __future__ import annotations

import time

import pytest

from build_shards import SampleOptions, ShardOptions, build_shards
from tests.test_ray_build import digests, sample

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.usefixtures("infer_first_sample_only", "without_local_ray"),
    pytest.mark.slow,
]

N, BLOCK = 160, 10  # 16 blocks
OPTS = dict(
    splits={"train": 0.7, "val": 0.3},
    seed=3,
    shards=ShardOptions(max_count=4, block_size=BLOCK),
    samples=SampleOptions(group_by="group"),
)
SMALL = 80 * 2**20  # object store bytes per node


def items() -> list[dict]:
    return [{"__key__": f"s{i:05d}", "i": i} for i in range(N)]


def sample_of(item: dict) -> dict:
    """The sample of item ``i``: what ``make`` returns, without its work (the reference build)."""
    return {**sample(item["i"]), "__key__": item["__key__"]}


def make(item: dict, log: str | None = None) -> dict:
    """The ``map``: the sample of item ``i``, after 20 ms of work; with ``log``, the node it ran
    on appended to that file (one line per item)."""
    if log is not None:
        with open(log, "a") as f:
            f.write(f"{ray.get_runtime_context().get_node_id()} {item['i']}\n")
    time.sleep(0.02)
    return sample_of(item)


class KillSecond:
    """A progress callback that, at the first finished block, waits until the second node has
    started mapping items of a block (a line of its own in ``log``), then removes that node."""

    def __init__(self, cluster, node, head_id: str, log: str) -> None:
        self.cluster, self.node, self.head_id, self.log = cluster, node, head_id, log
        self.killed = False

    def __call__(self, done: int, total: int) -> None:
        if self.killed:
            return
        deadline = time.monotonic() + 120
        while not self._second_started() and time.monotonic() < deadline:
            time.sleep(0.01)  # polls a condition (the tasks go on meanwhile), not a fixed pause
        self.killed = True
        self.cluster.remove_node(self.node, allow_graceful=False)

    def _second_started(self) -> bool:
        try:
            with open(self.log) as f:
                return any(line.split()[0] != self.head_id for line in f)
        except FileNotFoundError:
            return False


def test_a_node_killed_mid_build_loses_and_doubles_nothing_on_s3(tmp_path, s3_bucket):
    import s3fs
    from ray.cluster_utils import Cluster

    url, options = s3_bucket
    build_shards(items(), f"{url}/ref", map=sample_of, storage_options=options, **OPTS)
    fs = s3fs.S3FileSystem(**options)
    root = url[len("s3://") :]
    reference = digests(fs, f"{root}/ref")

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": SMALL},
    )
    try:
        second = cluster.add_node(num_cpus=1, object_store_memory=SMALL)
        ray.init(address=cluster.address, log_to_driver=False)
        head_id = ray.get_runtime_context().get_node_id()
        log = str(tmp_path / "nodes.log")
        kill = KillSecond(cluster, second, head_id, log)
        m = build_shards(
            items(), f"{url}/ray", engine="ray", storage_options=options, progress=kill,
            map=lambda item: make(item, log), **OPTS,
        )  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert kill.killed and m.num_samples == N
    assert digests(fs, f"{root}/ray") == reference
    assert not [p for p in fs.find(f"{root}/ray") if ".tmp-" in p]
    runs = [line.split() for line in open(log).read().splitlines()]
    assert {int(i) for _, i in runs} == set(range(N))
    second = {int(i) for node, i in runs if node != head_id}
    head = {int(i) for node, i in runs if node == head_id}
    assert second  # the second node was mapping a block when it was killed
    # A block it had not finished is done again on the head (``second & head`` beyond item 0,
    # which the driver maps too, for the schema); the kill can also land just after its block
    # finished, so that is not asserted: the exact output above is what must hold either way.
    assert head
