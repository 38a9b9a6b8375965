"""Replay from the plan: ``loader.batch_indices(epoch, step)`` names exactly the samples the
loader yielded in that step (no data read), for several topologies, after exact and elastic
resumes, and for a mix of sources."""

from __future__ import annotations

import numpy as np
import pytest

from build_shards import ShardOptions, build_shards
from wdsloader import Mix, MixSource, ShardDataset, Topology, create_loader

N = 157


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    out = {}
    for name, n in (("a", N), ("b", 61)):
        items = [{"__key__": f"{name}{i:04d}", "x": np.float32(i)} for i in range(n)]
        build_shards(items, root / name, shards=ShardOptions(max_count=20))
        out[name] = root / name
    return out


def _index_of_key(root):
    ds = ShardDataset(root, fields=[])
    return {ds[i]["__key__"]: i for i in range(len(ds))}


def _check_epochs(loader, index, epochs=(0, 1), skip=0):
    for epoch in epochs:
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader, start=skip):
            replay = loader.batch_indices(epoch, step)
            assert replay.source is None
            assert replay.index.tolist() == [index[k] for k in batch["__key__"]], (epoch, step)
        skip = 0


@pytest.mark.parametrize(
    ("world", "workers", "batch", "drop_last"),
    [(1, 0, 16, True), (1, 3, 7, False), (2, 2, 8, False), (3, 1, 5, True)],
)
def test_replayed_indices_are_the_yielded_samples(built, world, workers, batch, drop_last):
    index = _index_of_key(built["a"])
    for rank in range(world):
        loader = create_loader(
            built["a"], "train", batch, workers, drop_last=drop_last, shuffle=True, seed=4,
            topology=None if world == 1 else Topology(rank=rank, world_size=world),
        )  # fmt: skip
        _check_epochs(loader, index)


def test_replay_after_an_exact_resume_and_past_the_end(built):
    index = _index_of_key(built["a"])
    loader = create_loader(built["a"], "train", 8, 2, shuffle=True, seed=1)
    loader.set_epoch(1)
    it = iter(loader)
    first = [next(it)["__key__"] for _ in range(5)]
    state = loader.state_dict()
    del it
    again = create_loader(built["a"], "train", 8, 2, shuffle=True, seed=1)
    again.load_state_dict(state)
    for step, keys in enumerate(first):  # the steps before the resume: the same plan
        assert again.batch_indices(1, step).index.tolist() == [index[k] for k in keys]
    _check_epochs(again, index, epochs=(1,), skip=5)
    with pytest.raises(ValueError, match=r"epoch 1 has 19 batches on rank 0; step 19 is past"):
        again.batch_indices(1, 19)


def test_replay_after_an_elastic_resume(built):
    index = _index_of_key(built["a"])
    loader = create_loader(built["a"], "train", 8, 1, shuffle=True, seed=2, drop_last=False)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    del it
    for rank in range(2):
        again = create_loader(
            built["a"], "train", 8, 2, shuffle=True, seed=2, drop_last=False,
            topology=Topology(rank=rank, world_size=2),
        )  # fmt: skip
        again.load_state_dict(state)
        for step, batch in enumerate(again, start=4):
            assert again.batch_indices(0, step).index.tolist() == [
                index[k] for k in batch["__key__"]
            ]
        with pytest.raises(ValueError, match="step 3 of epoch 0 was played before this loader"):
            again.batch_indices(0, 3)


def test_replay_of_a_mix_names_each_samples_source(built):
    index = {name: _index_of_key(root) for name, root in built.items()}
    mix = Mix(
        [MixSource(built["a"], name="a"), MixSource(built["b"], name="b")], source_field="src"
    )
    loader = create_loader(mix, "train", 10, 2, shuffle=True, seed=9)
    for step, batch in enumerate(loader):
        replay = loader.batch_indices(0, step)
        assert replay.names == ("a", "b")
        assert replay.source.tolist() == batch["src"].tolist()
        names = [replay.names[s] for s in replay.source.tolist()]
        assert replay.index.tolist() == [
            index[n][k] for n, k in zip(names, batch["__key__"], strict=True)
        ]


def test_the_replay_command_prints_and_writes_the_steps_samples(built, tmp_path, capsys):
    from wdsloader.cli.commands import main

    loader = create_loader(
        built["a"], "train", 6, 2, seed=3, topology=Topology(rank=1, world_size=2)
    )
    loader.set_epoch(2)
    batches = list(loader)
    index = _index_of_key(built["a"])
    argv = [str(built["a"]), "--epoch", "2", "--step", "4", "--rank", "1", "--world-size", "2"]
    argv += ["--batch-size", "6", "--num-workers", "2", "--seed", "3", "--out", str(tmp_path / "o")]
    assert main(["replay", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = batches[4]["__key__"]
    assert lines == [f"{index[k]}\t{k}" for k in keys]
    written = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert written == sorted(f"{index[k]:09d}.x.json" for k in keys)
    first = (tmp_path / "o" / f"{index[keys[0]]:09d}.x.json").read_text()
    assert float(first) == int(keys[0][1:])  # the member's bytes as stored


def test_replay_on_s3_and_the_command_without_credentials(built, s3_bucket, tmp_path, capsys):
    import json

    import s3fs

    from wdsloader.cli.commands import main

    bucket, options = s3_bucket
    options = {**options, "key": "AKIDREPLAY", "secret": "replay-secret-value"}
    s3fs.S3FileSystem(**options).put(str(built["a"]), f"{bucket}/a", recursive=True)
    url = f"{bucket}/a"
    index = _index_of_key(built["a"])
    for rank in range(2):
        loader = create_loader(
            url, "train", 8, 2, shuffle=True, seed=6, storage_options=options,
            topology=Topology(rank=rank, world_size=2),
        )  # fmt: skip
        _check_epochs(loader, index)
        state = json.dumps(loader.state_dict())
        assert "replay-secret-value" not in state and "AKIDREPLAY" not in state
    loader.set_epoch(1)
    keys = list(loader)[3]["__key__"]
    argv = [url, "--epoch", "1", "--step", "3", "--rank", "1", "--world-size", "2"]
    argv += ["--batch-size", "8", "--num-workers", "2", "--seed", "6", "--out", str(tmp_path / "o")]
    argv += ["--storage-option=key=AKIDREPLAY", "--storage-option=secret=replay-secret-value"]
    argv += [
        f"--storage-option=client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}"
    ]
    assert main(["replay", *argv]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{index[k]}\t{k}" for k in keys]
    assert "replay-secret-value" not in out + err and "AKIDREPLAY" not in out + err
    written = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    local = ShardDataset(built["a"])
    assert written == {f"{index[k]:09d}.x.json": local.members(index[k])[1]["x.json"] for k in keys}
