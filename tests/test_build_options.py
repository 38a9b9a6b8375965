"""build_shards' option objects: each loose keyword of 0.1 still works with a DeprecationWarning
naming its replacement and writes the same bytes as the new form; the objects refuse what
cannot be meant; the resume fingerprint of a build is the one the keywords gave."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from build_shards import (
    BuildOptions,
    LoaderDefaults,
    LockOptions,
    RayEngine,
    SampleOptions,
    ShardOptions,
    build_shards,
)
from build_shards.layout.params import BuildParams
from build_shards.resolve import DEPRECATED, resolve_options
from wdsloader import Curriculum

CURRICULUM = Curriculum({"zero": None, "a": "vec"}, seed=3)
VEC_SCHEMA = {"vec": {"ext": "vec.npy", "encoding": "npy", "dtype": "float32", "shape": ["D"]}}


def rows(n: int = 40, nan: bool = False) -> list[dict[str, Any]]:
    out = [
        {
            "__key__": f"k{i:03d}",
            "name": f"n{i:03d}",
            "grp": f"g{i % 5}",
            "part": "a" if i % 3 else "b",
            "x": float(i) / 3,
            "vec": np.full(2, i, np.float32),
        }
        for i in range(n)
    ]
    if nan:
        out[5]["x"] = math.nan
    return out


# deprecated keywords -> the same options in the new form (and the keywords both take)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "shard_max_count": ({"shard_max_count": 7}, {"shards": ShardOptions(max_count=7)}, {}),
    "shard_max_bytes": ({"shard_max_bytes": 8192}, {"shards": ShardOptions(max_bytes=8192)}, {}),
    "block_size": ({"block_size": 9}, {"shards": ShardOptions(block_size=9)}, {}),
    "compression": ({"compression": "gzip"}, {"shards": ShardOptions(compression="gzip")}, {}),
    "group_small_fields": (
        {"group_small_fields": True},
        {"shards": ShardOptions(group_small_fields=True)},
        {},
    ),
    "key_field": ({"key_field": "name"}, {"samples": SampleOptions(key_field="name")}, {}),
    "split_field": ({"split_field": "part"}, {"samples": SampleOptions(split_field="part")}, {}),
    "group_by": (
        {"group_by": "grp"},
        {"samples": SampleOptions(group_by="grp")},
        {"splits": {"a": 0.5, "b": 0.5}},
    ),
    "dims": ({"dims": {"D": 2}}, {"samples": SampleOptions(dims={"D": 2})}, {"schema": VEC_SCHEMA}),
    "allow_nan": ({"allow_nan": True}, {"samples": SampleOptions(allow_nan=True)}, {}),
    "lock_timeout": ({"lock_timeout": 60.0}, {"lock": LockOptions(timeout=60.0)}, {}),
    "break_lock": ({"break_lock": True}, {"lock": LockOptions(break_lock=True)}, {}),
    "loader_defaults": (
        {"loader_defaults": {"collate": "default", "k": 1}},
        {"defaults": LoaderDefaults(collate="default", extra={"k": 1})},
        {},
    ),
    "curriculum": (
        {"curriculum": CURRICULUM},
        {"defaults": LoaderDefaults(curriculum=CURRICULUM)},
        {},
    ),
}
REPLACEMENT = {
    "shard_max_count": "shards=ShardOptions(max_count=...)",
    "shard_max_bytes": "shards=ShardOptions(max_bytes=...)",
    "block_size": "shards=ShardOptions(block_size=...)",
    "compression": "shards=ShardOptions(compression=...)",
    "group_small_fields": "shards=ShardOptions(group_small_fields=...)",
    "key_field": "samples=SampleOptions(key_field=...)",
    "split_field": "samples=SampleOptions(split_field=...)",
    "group_by": "samples=SampleOptions(group_by=...)",
    "dims": "samples=SampleOptions(dims=...)",
    "allow_nan": "samples=SampleOptions(allow_nan=...)",
    "lock_timeout": "lock=LockOptions(timeout=...)",
    "break_lock": "lock=LockOptions(break_lock=...)",
    "ray_address": "engine=RayEngine(address=...)",
    "loader_defaults": "defaults={...} (a mapping or LoaderDefaults)",
    "curriculum": "defaults=LoaderDefaults(curriculum=...)",
}


def test_every_deprecated_keyword_has_a_case():
    assert set(REPLACEMENT) == set(DEPRECATED)
    assert set(CASES) == set(DEPRECATED) - {"ray_address"}  # Ray: see the test below


def written(root: Path) -> dict[str, bytes]:
    """Every file of a dataset, the manifest without its creation time."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest["build"].pop("created")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.mark.parametrize("old", sorted(CASES))
def test_a_deprecated_keyword_warns_and_writes_the_bytes_of_the_new_form(tmp_path, old):
    deprecated, new, both = CASES[old]
    source = rows(nan=old == "allow_nan")
    message = f"build_shards({old}=...) is deprecated: pass {REPLACEMENT[old]}; removed in 0.2.0"
    with pytest.warns(DeprecationWarning) as caught:
        build_shards(source, tmp_path / "old", **deprecated, **both)
    assert [str(w.message) for w in caught] == [message]
    assert caught[0].filename == __file__  # it points at the call, not into build_shards
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        build_shards(source, tmp_path / "new", **new, **both)
    assert written(tmp_path / "old") == written(tmp_path / "new")
    assert resolve_options({**deprecated, **both}) == resolve_options({**new, **both})


def test_ray_address_becomes_a_ray_engine():
    with pytest.warns(DeprecationWarning, match=r"pass engine=RayEngine\(address=\.\.\.\)"):
        options = resolve_options({"engine": "ray", "ray_address": "ray://head:10001"})
    assert options.engine == RayEngine(address="ray://head:10001")
    with pytest.warns(DeprecationWarning):
        same = resolve_options({"engine": RayEngine(address="x"), "ray_address": "x"})
    assert same.engine == RayEngine(address="x")
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(
            ValueError, match=r"ray_address is an option of engine='ray': pass engine=RayEngine"
        ),
    ):
        resolve_options({"engine": "local", "ray_address": "x"})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ShardOptions(max_count=0), "ShardOptions.max_count must be a positive int, got 0"),
        (
            lambda: ShardOptions(max_bytes=True),
            "ShardOptions.max_bytes must be a positive int, got True",
        ),
        (
            lambda: ShardOptions(block_size=0),
            "ShardOptions.block_size must be a positive int or None, got 0",
        ),
        (
            lambda: ShardOptions(compression="zstd"),
            "ShardOptions.compression must be None or one of ('gzip',), got 'zstd'",
        ),
        (
            lambda: ShardOptions(group_small_fields=1),  # type: ignore[arg-type]
            "ShardOptions.group_small_fields must be True or False, got 1",
        ),
        (
            lambda: SampleOptions(key_field=""),
            "SampleOptions.key_field must be a non-empty string, got ''",
        ),
        (
            lambda: SampleOptions(split_field="part", group_by="grp"),
            "SampleOptions(split_field='part', group_by='grp'): group_by groups the samples that "
            "splits= fractions assign, split_field names each sample's split; set one of them",
        ),
        (
            lambda: SampleOptions(dims=[("D", 2)]),  # type: ignore[arg-type]
            "SampleOptions.dims must be a mapping or None, got [('D', 2)]",
        ),
        (
            lambda: LockOptions(timeout=0),
            "LockOptions.timeout must be a positive number or None, got 0",
        ),
        (
            lambda: LockOptions(break_lock="yes"),  # type: ignore[arg-type]
            "LockOptions.break_lock must be True or False, got 'yes'",
        ),
        (
            lambda: RayEngine(address=""),
            "RayEngine.address must be a non-empty string or None, got ''",
        ),
        (
            lambda: LoaderDefaults(extra={"collate": "x"}),
            "LoaderDefaults: 'collate' is a field of its own, not an entry of extra",
        ),
        (lambda: BuildOptions(workers=0), "workers must be a positive int, got 0"),
    ],
)
def test_an_option_object_refuses_what_cannot_be_meant(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_a_deprecated_keyword_that_disagrees_with_its_object_is_a_value_error(tmp_path):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError) as info:
        build_shards(rows(), tmp_path, shard_max_count=5, shards=ShardOptions(max_count=7))
    assert str(info.value) == (
        "build_shards(shard_max_count=5) disagrees with shards=ShardOptions(max_count=7): "
        "pass shards= only (shard_max_count is deprecated)"
    )
    assert not tmp_path.joinpath("manifest.json").exists()
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="defaults= disagree"):
        resolve_options({"loader_defaults": {"k": 1}, "defaults": {"k": 2}})
    with pytest.warns(DeprecationWarning):  # the same value twice is what was meant
        same = resolve_options({"key_field": "name", "samples": SampleOptions(key_field="name")})
    assert same.samples == SampleOptions(key_field="name")
    with pytest.warns(DeprecationWarning):  # one object gets every keyword of its fields
        both = resolve_options({"shard_max_count": 5, "shards": ShardOptions(max_bytes=4096)})
    assert both.shards == ShardOptions(max_count=5, max_bytes=4096)


def test_split_field_with_splits_keeps_its_error(tmp_path):
    from build_shards import BuildError

    with pytest.raises(BuildError, match="choose one way to assign splits, not splits and split_f"):
        build_shards(rows(), tmp_path, splits={"a": 1.0}, samples=SampleOptions(split_field="part"))


def test_an_unknown_keyword_is_a_type_error_like_pythons(tmp_path):
    with pytest.raises(TypeError) as info:
        build_shards(rows(), tmp_path, shard_max_cnt=5)
    assert str(info.value) == "build_shards() got an unexpected keyword argument 'shard_max_cnt'"
    from build_shards.text import build_text_shards

    with pytest.raises(TypeError) as text:
        build_text_shards(tmp_path / "in.txt", tmp_path / "t", None, seq_length=4, nope=1)
    assert str(text.value) == "build_text_shards() got an unexpected keyword argument 'nope'"


# computed with the build of 0.1 (build_shards with its 26 keywords, commit 3fcf136)
OLD_FINGERPRINTS = {
    "default": "9e5ef8316cd5a0e7ca1c7cfe515debc0375d7764d892480c40325e89682d898f",
    "custom": "eb89350a289e87d2cfda14557fa78ab6d792679253190f56727988c745d1cfb3",
}


def old_rows() -> list[dict[str, Any]]:
    return [
        {"__key__": f"k{i:03d}", "id": f"g{i % 5}", "x": i, "y": float(i) / 3, "name": f"n{i}"}
        for i in range(40)
    ]


def test_the_resume_fingerprint_is_the_one_of_the_keywords(tmp_path, monkeypatch):
    """A rerun of a build left unfinished by 0.1 resumes: same options, same fingerprint."""
    seen: list[str] = []
    real = BuildParams.fingerprint

    def spy(self: BuildParams) -> str:
        seen.append(real(self))
        return seen[-1]

    monkeypatch.setattr(BuildParams, "fingerprint", spy)
    build_shards(old_rows(), tmp_path / "default")
    assert seen[-1] == OLD_FINGERPRINTS["default"]
    build_shards(
        old_rows(),
        tmp_path / "custom",
        splits={"train": 0.7, "val": 0.3},
        seed=3,
        shards=ShardOptions(
            max_count=7, max_bytes=10**6, block_size=9, compression="gzip", group_small_fields=True
        ),
        samples=SampleOptions(group_by="id", key_field="name", allow_nan=True),
    )
    assert seen[-1] == OLD_FINGERPRINTS["custom"]


def test_the_command_line_and_the_text_builder_use_no_deprecated_keyword(tmp_path, capsys):
    from build_shards.cli import main

    (tmp_path / "a.jsonl").write_text(
        "".join(f'{{"k": "k{i}", "g": "x{i % 3}"}}\n' for i in range(9))
    )
    argv = [
        "build", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "out"), "--shard-max-count", "4",
        "--splits", "a=0.5,b=0.5", "--group-by", "g", "--lock-timeout", "30", "--force-unlock",
        "--compression", "gzip", "--group-small-fields", "--allow-nan", "--key-field", "k",
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert main(argv) == 0
    capsys.readouterr()
    build = json.loads((tmp_path / "out" / "manifest.json").read_text())["build"]
    assert (build["shard_max_count"], build["group_by"], build["key_field"]) == (4, "g", "k")
    assert (build["compression"], build["allow_nan"]) == ("gzip", True)


def test_the_text_builder_takes_the_option_objects_and_warns_at_its_caller(tmp_path):
    pytest.importorskip("tokenizers")
    from build_shards.text import build_text_shards
    from tests.tokenizers_util import tiny_tokenizer, words

    (tmp_path / "in.txt").write_text("\n\n".join(words(20, seed=s) for s in range(6)) + "\n")
    tok = tiny_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = build_text_shards(
            tmp_path / "in.txt", tmp_path / "new", tok, seq_length=8,
            shards=ShardOptions(max_count=4), lock=LockOptions(timeout=30),
            defaults={"k": 1},
        )  # fmt: skip
    assert new.loader_defaults == {"collate": "causal_lm", "k": 1}
    with pytest.warns(DeprecationWarning) as caught:
        old = build_text_shards(
            tmp_path / "in.txt", tmp_path / "old", tok, seq_length=8, shard_max_count=4,
            lock_timeout=30, loader_defaults={"k": 1},
        )  # fmt: skip
    assert [str(w.message).split(" is ")[0] for w in caught] == [
        "build_text_shards(shard_max_count=...)",
        "build_text_shards(lock_timeout=...)",
        "build_text_shards(loader_defaults=...)",
    ]
    assert {w.filename for w in caught} == {__file__}
    assert written(tmp_path / "old") == written(tmp_path / "new")
    assert old.loader_defaults == new.loader_defaults
    with pytest.raises(TypeError, match="build_text_shards sets the key itself"):
        build_text_shards(
            tmp_path / "in.txt", tmp_path / "k", tok, seq_length=8,
            samples=SampleOptions(key_field="id"),
        )  # fmt: skip


def test_the_engine_seam_reads_the_engine_option():
    from build_shards.engines import LocalEngine, make_engine
    from build_shards.engines.ray_engine import RayClusterEngine

    assert isinstance(make_engine("local", workers=2), LocalEngine)
    for engine, address in (("ray", None), (RayEngine(), None), (RayEngine(address="h:1"), "h:1")):
        made = make_engine(engine)  # nothing connects to Ray before a build runs
        assert isinstance(made, RayClusterEngine) and made.address == address
    with pytest.raises(ValueError, match="workers is an option of the local engine"):
        make_engine(RayEngine(address="h:1"), workers=2)
    with pytest.raises(ValueError) as info:
        make_engine("spark")
    assert str(info.value) == "engine must be one of 'local', 'ray' or a RayEngine, got 'spark'"


def test_the_library_errors_name_the_option_objects_and_the_cli_its_flags(tmp_path, capsys):
    from build_shards import OutputLockedError
    from build_shards.cli import main
    from build_shards.commit.lock import BuildLock
    from wdsloader.errors import SchemaError
    from wdsloader.io.storage import url_to_fs

    with pytest.raises(SchemaError) as nan:
        build_shards(rows(nan=True), tmp_path / "nan")
    assert "NaN or Inf value (pass samples=SampleOptions(allow_nan=True) to keep" in str(nan.value)
    out = str(tmp_path / "held")
    fs, root = url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    with BuildLock(fs, root, out, fingerprint="another build"):
        with pytest.raises(OutputLockedError) as held:
            build_shards(rows(), out)
        assert str(held.value).endswith("if it is dead, pass lock=LockOptions(break_lock=True)")
        (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
        with pytest.raises(SystemExit):
            main(["build", str(tmp_path / "a.jsonl"), "-o", out])
    assert capsys.readouterr().err.rstrip().endswith("if it is dead, pass --force-unlock")


def test_the_small_records_hint_names_the_shard_options(tmp_path, caplog):
    import logging

    small = [{"a": i, "b": f"s{i}", "c": i % 2 == 0} for i in range(50)]
    with caplog.at_level(logging.INFO, logger="build_shards"):
        build_shards(small, tmp_path / "plain")
        build_shards(small, tmp_path / "grouped", shards=ShardOptions(group_small_fields=True))
    hints = [
        r.getMessage().split("); ")[1] for r in caplog.records if "tar bytes" in r.getMessage()
    ]
    assert hints == [
        "shards=ShardOptions(group_small_fields=True, compression='gzip') makes such shards much "
        "smaller (CLI: --group-small-fields, --compression gzip)",
        "shards=ShardOptions(compression='gzip') makes such shards much smaller "
        "(CLI: --group-small-fields, --compression gzip)",
    ]
