"""Ray Data in and out (the session's small local Ray): a ``ray.data.Dataset`` built with
``engine="ray"`` gives the same shards for any block layout (and the local engine's)."""

from __future__ import annotations

import numpy as np
import pytest

from build_shards import BuildError, SampleOptions, ShardOptions, build_shards
from tests.test_ray_build import local_digests

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

pytestmark = [pytest.mark.usefixtures("local_ray"), pytest.mark.slow]  # a Ray cluster

OPTS = dict(
    splits={"train": 0.7, "val": 0.3},
    seed=3,
    shards=ShardOptions(max_count=16, block_size=50),
    samples=SampleOptions(key_field="key"),
)
N = 230
# the items' blocks before the tests' own layouts: Ray Data's default for from_items (200 blocks
# of one or two rows) spends ~5 s per run of the pipeline on the tasks of those tiny blocks
IN_BLOCKS = 6


def rows(n: int = N) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "key": f"r{i:05d}",
            "emb": rng.standard_normal(8).astype(np.float32),
            "label": i % 5,
            "text": "w " * (i % 11),
        }
        for i in range(n)
    ]


def items():
    """The rows as a ``ray.data.Dataset`` of IN_BLOCKS blocks."""
    import ray.data

    return ray.data.from_items(rows(), override_num_blocks=IN_BLOCKS)


def test_two_block_layouts_give_the_same_shards(tmp_path):
    base = items().map(lambda r: {**r, "label": r["label"] * 10})
    built = {}
    for layout in (3, 17):
        ds = base.repartition(layout)
        assert ds.materialize().num_blocks() == layout
        m = build_shards(ds, tmp_path / f"ray{layout}", engine="ray", **OPTS)
        assert m.num_samples == N and m.build["num_blocks"] == 5
        built[layout] = local_digests(tmp_path / f"ray{layout}")
    assert built[3] == built[17]
    assert sum(p.endswith(".tar") for p in built[3]) >= 10
    m = build_shards(base.repartition(5), tmp_path / "local", **OPTS)  # the local engine
    assert local_digests(tmp_path / "local") == built[3]
    first = next(iter(m.splits["train"].shards))
    assert first.num_samples > 0


def test_write_shards_ends_a_ray_data_pipeline_with_our_shards_and_manifest(tmp_path):
    from build_shards import write_shards
    from wdsloader.format import Manifest

    ds = items().repartition(4).filter(lambda r: r["label"] != 0)
    m = write_shards(ds, tmp_path / "out", **OPTS)
    kept = [r for r in rows() if r["label"] != 0]
    assert m.num_samples == len(kept)
    assert Manifest.load(str(tmp_path / "out")).num_samples == len(kept)
    names = sorted(p.name for p in (tmp_path / "out").rglob("*.tar"))
    assert names and all(n.startswith(("train-0", "val-0")) for n in names)  # our names
    assert not (tmp_path / "out" / "_build").exists()
    again = write_shards(ds.repartition(9), tmp_path / "again", **OPTS)
    assert again.num_samples == m.num_samples
    assert local_digests(tmp_path / "again") == local_digests(tmp_path / "out")
    with pytest.raises(TypeError, match="write_shards writes a ray.data.Dataset, got list"):
        write_shards(rows(), tmp_path / "x")
    with pytest.raises(
        BuildError, match="build it with engine='ray' .or workers=1., not workers=2"
    ):
        build_shards(ds, tmp_path / "x", workers=2, **OPTS)
    assert not (tmp_path / "x").exists()
