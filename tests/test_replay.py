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


def _mix_lines(loader, index, epoch, names):
    """``source<TAB>index<TAB>key`` of each batch the mixed loader yields in ``epoch``."""
    loader.set_epoch(epoch)
    out = []
    for batch in loader:
        srcs = [names[s] for s in batch["src"].tolist()]
        out.append(
            [f"{n}\t{index[n][k]}\t{k}" for n, k in zip(srcs, batch["__key__"], strict=True)]
        )
    return out


def _replay(argv, capsys):
    from wdsloader.cli.commands import main

    assert main(["replay", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(("world", "workers", "batch"), [(1, 0, 16), (2, 2, 7), (3, 1, 5)])
def test_the_replay_command_over_a_mix(built, tmp_path, capsys, world, workers, batch):
    import json

    from wdsloader.mix.mix_file import mix_to_dict

    index = {"wiki": _index_of_key(built["a"]), "code": _index_of_key(built["b"])}
    sources = [MixSource(built["a"], name="wiki", weight=0.7),
               MixSource(built["b"], name="code", weight=0.3)]  # fmt: skip
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps(mix_to_dict(Mix(sources, epoch_samples=150))))
    by_args = [str(built["a"]), str(built["b"]), "--weights", "0.7,0.3", "--names", "wiki,code"]
    by_args += ["--epoch-samples", "150"]
    for rank in range(world):
        mix = Mix(sources, epoch_samples=150, source_field="src")
        loader = create_loader(
            mix, "train", batch, workers, shuffle=True, seed=5,
            topology=Topology(rank=rank, world_size=world),
        )  # fmt: skip
        for epoch in (0, 2):
            yielded = _mix_lines(loader, index, epoch, ("wiki", "code"))
            common = ["--epoch", str(epoch), "--rank", str(rank), "--world-size", str(world)]
            common += ["--batch-size", str(batch), "--num-workers", str(workers), "--seed", "5"]
            for step in (0, len(yielded) // 2, len(yielded) - 1):
                at = [*common, "--step", str(step)]
                assert _replay([*by_args, *at], capsys) == yielded[step], (rank, epoch, step)
                assert _replay(["--mix", str(spec), *at], capsys) == yielded[step]
    out = tmp_path / "o"
    lines = _replay(["--mix", str(spec), *at, "--out", str(out)], capsys)
    want: dict[str, set[str]] = {"wiki": set(), "code": set()}
    for line in lines:
        name, i, _ = line.split("\t")
        want[name].add(f"{int(i):09d}.x.json")
    got = {p.name: {f.name for f in p.iterdir()} for p in out.iterdir()}
    assert got == {n: files for n, files in want.items() if files}


def test_the_replay_command_over_a_mix_after_a_resume(built, tmp_path, capsys):
    import json

    index = {"a": _index_of_key(built["a"]), "b": _index_of_key(built["b"])}
    spec = {"sources": [{"url": str(built["a"]), "samples": 40},
                        {"url": str(built["b"]), "repeat": 1.5}]}  # fmt: skip
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    mix = Mix([MixSource(built["a"], samples=40), MixSource(built["b"], repeat=1.5)],
              source_field="src")  # fmt: skip
    loader = create_loader(mix, "train", 9, 2, shuffle=True, seed=8)
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    del it
    again = create_loader(mix, "train", 9, 2, shuffle=True, seed=8)
    again.load_state_dict(state)
    rest = _mix_lines(again, index, 1, ("a", "b"))
    assert len(rest) == 14 - 4  # 40 + 91 samples: 14 full batches of 9
    argv = ["--mix", str(tmp_path / "mix.json"), "--epoch", "1", "--batch-size", "9"]
    argv += ["--num-workers", "2", "--seed", "8"]
    for step in (4, 9, 13):
        assert _replay([*argv, "--step", str(step)], capsys) == rest[step - 4], step


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["A", "B", "--weights", "1"], "--weights '1': 1 values for 2 DATASETs"),
        (
            ["A", "--mix", "m.json"],
            "--mix holds the sources and the mix's options: not with DATASET arguments",
        ),  # fmt: skip
        ([], "give a DATASET (several for a mix) or --mix MIX.JSON"),
        (["--mix", "{}"], "mix.json: unknown keys ['source']"),
        (["--mix", "[]"], "mix.json: expected a JSON object, got list"),
        (
            ["--mix", '{"sources": [{"url": "A", "weight": 1, "samples": 3}]}'],
            "mix.json: sources[0]: MixSource 'A': give one of weight=, samples= or repeat=",
        ),
    ],
)
def test_replay_arguments_that_do_not_fit_name_the_flag(tmp_path, capsys, argv, error):
    from wdsloader.cli.commands import main

    if "--mix" in argv and argv[-1] != "m.json":
        spec = tmp_path / "mix.json"
        spec.write_text(argv[-1].replace("{}", '{"source": []}'))
        argv = [*argv[:-1], str(spec)]
    assert main(["replay", *argv, "--epoch", "0", "--step", "0", "--batch-size", "2"]) == 2
    assert error in capsys.readouterr().err


def test_the_replay_command_over_an_s3_mix_never_shows_credentials(
    built, s3_bucket, tmp_path, capsys
):
    import json

    import s3fs

    bucket, options = s3_bucket
    options = {**options, "key": "AKIDMIXREPLAY", "secret": "mix-replay-secret"}
    fs = s3fs.S3FileSystem(**options)
    for name in ("a", "b"):
        fs.put(str(built[name]), f"{bucket}/{name}", recursive=True)
    spec = {"sources": [{"url": f"{bucket}/a", "weight": 2}, {"url": f"{bucket}/b", "weight": 1}],
            "epoch_samples": 60}  # fmt: skip
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    index = {"a": _index_of_key(built["a"]), "b": _index_of_key(built["b"])}
    mix = Mix([MixSource(built["a"], weight=2), MixSource(built["b"], weight=1)],
              epoch_samples=60, source_field="src")  # fmt: skip
    loader = create_loader(mix, "train", 8, 2, seed=6, topology=Topology(rank=1, world_size=2))
    want = _mix_lines(loader, index, 1, ("a", "b"))[2]
    argv = ["--mix", str(tmp_path / "mix.json"), "--epoch", "1", "--rank", "1"]
    argv += ["--world-size", "2", "--batch-size", "8", "--num-workers", "2", "--seed", "6"]
    argv += ["--storage-option=key=AKIDMIXREPLAY", "--storage-option=secret=mix-replay-secret"]
    argv += [
        f"--storage-option=client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}"
    ]
    out = tmp_path / "o"
    from wdsloader.cli.commands import main

    assert main(["replay", *argv, "--step", "2", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert printed.splitlines() == want
    assert "mix-replay-secret" not in printed + err and "AKIDMIXREPLAY" not in printed + err
    files = {f"{p.parent.name}/{p.name}": p.read_bytes() for p in out.glob("*/*")}
    assert files == {
        f"{n}/{int(i):09d}.x.json": ShardDataset(built[n]).members(int(i))[1]["x.json"]
        for n, i, _ in (line.split("\t") for line in want)
    }
    assert main(["replay", *argv, "--step", "99"]) == 2  # past the end: an error, masked
    _, err = capsys.readouterr()
    assert "step 99 is past its end" in err
    assert "mix-replay-secret" not in err and "AKIDMIXREPLAY" not in err
