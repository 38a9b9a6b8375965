"""Reading manifest.json: every malformed value and every hostile shard path is a ManifestError
naming the file and the field, never another exception, and no byte outside the dataset root is
ever requested."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.dataset_factory import write_dataset
from tests.http_server import http_server_fixture  # noqa: F401
from wdsloader import create_loader
from wdsloader.errors import ManifestError
from wdsloader.format import FieldSpec, Manifest

SHA = "ab" * 32
VALID = {
    "format": "wdsloader",
    "version": "1.0",
    "schema": {
        "vec": {"ext": "vec.npy", "encoding": "npy", "dtype": "float32", "shape": ["D"]},
        "steer_a": {"ext": "steer_a.npy", "encoding": "npy", "dtype": "float32", "shape": ["D"]},
        "idx": {"ext": "idx.cls", "encoding": "cls", "dtype": "int64", "shape": [], "range": [0, 9]},
        "meta": {"ext": "meta.json", "encoding": "json", "dtype": "json"},
    },
    "dims": {"D": 4},
    "splits": {
        "train": {
            "num_samples": 7,
            "num_bytes": 9000,
            "shards": [
                {"path": "train/shard-000000.tar", "idx_path": "train/shard-000000.tar.idx",
                 "num_samples": 4, "num_bytes": 5000, "sha256": SHA,
                 "layout": {"vec.npy": [640, 16], "idx.cls": [1536, 1]}},
                {"path": "train/shard-000001.tar", "idx_path": "train/shard-000001.tar.idx",
                 "num_samples": 3, "num_bytes": 4000},
            ],
        }
    },
    "totals": {"num_samples": 7, "num_bytes": 9000},
    "build": {"seed": 0, "params": {"shard_max_count": 4}},
    "loader_defaults": {
        "collate": "default",
        "curriculum": {"variants": {"zero": None, "a": "steer_a"}, "output": "steering"},
    },
}  # fmt: skip


def _with(change) -> dict:
    doc = copy.deepcopy(VALID)
    change(doc)
    return doc


def _shard(doc, i=1):
    return doc["splits"]["train"]["shards"][i]


def _nested(depth: int) -> dict:
    node: dict = {}
    for _ in range(depth):
        node = {"x": node}
    return node


MALFORMED = [
    (lambda d: _shard(d).update(num_samples="abc"),
     r"splits\.train\.shards\[1\]\.num_samples: expected a non-negative integer, got 'abc'"),
    (lambda d: _shard(d).update(num_samples=-1), r"splits\.train\.shards\[1\]\.num_samples: .* got -1"),
    (lambda d: _shard(d).update(num_samples=3.0), r"splits\.train\.shards\[1\]\.num_samples: .* got 3\.0"),
    (lambda d: _shard(d).update(num_samples=True), r"splits\.train\.shards\[1\]\.num_samples: .* got True"),
    (lambda d: _shard(d).update(num_bytes=2**70), r"splits\.train\.shards\[1\]\.num_bytes: .*integer"),
    (lambda d: _shard(d, 0).update(sha256=12), r"splits\.train\.shards\[0\]\.sha256: expected a sha256 of 64"),
    (lambda d: _shard(d, 0).update(sha256="zz"), r"splits\.train\.shards\[0\]\.sha256: .* got 'zz'"),
    (lambda d: _shard(d, 0).update(layout=[[0, 1]]), r"splits\.train\.shards\[0\]\.layout: expected an object"),
    (lambda d: _shard(d, 0)["layout"].update({"vec.npy": [640]}),
     r"splits\.train\.shards\[0\]\.layout\.vec\.npy: expected \[offset, size\], got \[640\]"),
    (lambda d: _shard(d, 0)["layout"].update({"vec.npy": [640, "16"]}),
     r"splits\.train\.shards\[0\]\.layout\.vec\.npy\[1\]: expected a non-negative integer"),
    (lambda d: _shard(d).pop("path"), r"splits\.train\.shards\[1\]: missing 'path'"),
    (lambda d: _shard(d).update(colour=1), r"splits\.train\.shards\[1\]: unknown key\(s\) 'colour'"),
    (lambda d: d["splits"]["train"].update(shards="x.tar"),
     r"splits\.train\.shards: expected a list, got 'x\.tar'"),
    (lambda d: d["splits"]["train"]["shards"].__setitem__(0, None),
     r"splits\.train\.shards\[0\]: expected an object, got None"),
    (lambda d: d["splits"]["train"].pop("shards"), r"splits\.train: missing 'shards'"),
    (lambda d: [_shard(d, i).update(num_samples=2**62) for i in (0, 1)],  # each fits int64
     r"splits\.train: its shards' num_samples sum to 9223372036854775808, more than an int64 "
     r"holds \(9223372036854775807\)$"),
    (lambda d: [_shard(d, i).update(num_bytes=2**63 - 1) for i in (0, 1)],
     r"splits\.train: its shards' num_bytes sum to 18446744073709551614, more than an int64"),
    (lambda d: d["splits"]["train"].update(num_samples="7"), r"splits\.train\.num_samples: "),
    (lambda d: d.update(splits=[]), r"splits: expected an object, got \[\]"),
    (lambda d: d["splits"].update(val=3), r"splits\.val: expected an object, got 3"),
    (lambda d: d["schema"]["vec"].update(shape="D"), r"schema\.vec\.shape: expected a list"),
    (lambda d: d["schema"]["vec"].update(shape=["D", -2]),
     r"schema\.vec\.shape\[1\]: expected a non-negative integer, got -2"),
    (lambda d: d["schema"]["vec"].update(shape=[None]), r"schema\.vec\.shape\[0\]: .* None"),
    (lambda d: d["schema"]["vec"].update(dtype="float33"),
     r"schema\.vec\.dtype: expected a numpy dtype name, got 'float33'"),
    (lambda d: d["schema"]["vec"].update(dtype="O"), r"schema\.vec\.dtype: .*without Python obj"),
    (lambda d: d["schema"]["meta"].update(dtype=5), r"schema\.meta\.dtype: expected a non-empty"),
    (lambda d: d["schema"]["idx"].update(range=[9, 0]), r"schema\.idx\.range: .*low <= high"),
    (lambda d: d["schema"]["idx"].update(range=["a", 1]),
     r"schema\.idx\.range\[0\]: expected a number, got 'a'"),
    (lambda d: d["schema"]["idx"].update(range=[1]), r"schema\.idx\.range: expected \[low, high\]"),
    (lambda d: d["schema"].update(vec="npy"), r"schema\.vec: expected an object, got 'npy'"),
    (lambda d: d["schema"]["vec"].pop("ext"), r"schema\.vec: missing 'ext'"),
    (lambda d: d["schema"]["vec"].update(encoding=None), r"schema\.vec\.encoding: expected a"),
    (lambda d: d.update(schema=None), r"schema: expected an object, got None"),
    (lambda d: d["dims"].update(D="4"), r"dims\.D: expected a non-negative integer, got '4'"),
    (lambda d: d.update(dims=[4]), r"dims: expected an object"),
    (lambda d: d.update(version=1), r"version: expected a non-empty string, got 1"),
    (lambda d: d.update(build=_nested(100)), r"build: nested deeper than 32 levels"),
    (lambda d: d.update(build="x"), r"build: expected an object"),
    (lambda d: d["loader_defaults"].update(collate=3), r"loader_defaults\.collate: expected a"),
    (lambda d: d["loader_defaults"].update(curriculum=3),
     r"loader_defaults\.curriculum: expected an object, got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), MALFORMED)
def test_malformed_manifest_names_file_and_field(change, message):
    with pytest.raises(ManifestError, match=rf"^ds/manifest\.json: {message}"):
        Manifest.from_dict(_with(change), source="ds/manifest.json")


def test_a_stored_curriculum_that_does_not_build_is_refused_where_it_is_built(tmp_path, capsys):
    """The format layer checks loader_defaults' types only (it imports no curriculum); the
    loader, validate and info refuse a default curriculum that does not build, naming the file
    and the field, as reading the manifest did."""
    from wdsloader.cli.commands import main
    from wdsloader.validate import validate_dataset

    root = str(tmp_path / "ds")
    write_dataset(root, {"train": [4]})
    data = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    data["loader_defaults"]["curriculum"] = {"variants": 3, "output": "steering"}
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(data))
    assert Manifest.load(root).loader_defaults["curriculum"]["variants"] == 3
    message = (
        rf"^{re.escape(root)}/manifest\.json: loader_defaults\.curriculum: curriculum variants: "
        "expected a mapping"
    )
    for curriculum in (None, False):
        with pytest.raises(ManifestError, match=message):
            create_loader(root, "train", batch_size=2, curriculum=curriculum)
    with pytest.raises(ManifestError, match=message):
        validate_dataset(root)
    assert main(["info", root]) == 2
    assert re.match(message.replace("^", "^wdsloader: error: "), capsys.readouterr().err)


def test_manifest_load_and_save_work_from_the_format_layer_alone(tmp_path):
    """Manifest.load/save delegate to wdsloader.io.manifest_io, imported at their first use
    (not by ``import wdsloader``, which stays light), whatever is imported first."""
    code = (
        "import sys\n"
        "from wdsloader.format.manifest import Manifest\n"
        "assert 'wdsloader.io.manifest_io' not in sys.modules and 'fsspec' not in sys.modules\n"
        f"m = Manifest.load({str(tmp_path)!r})\n"
        f"print(m.save({str(tmp_path / 'copy')!r}), m.split('train').num_samples)\n"
    )
    write_dataset(str(tmp_path), {"train": [3, 2]})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(tmp_path / "copy" / "manifest.json"), "5"]
    assert Manifest.load(str(tmp_path / "copy")) == Manifest.load(str(tmp_path))


def test_the_valid_manifest_loads():
    m = Manifest.from_dict(copy.deepcopy(VALID))
    assert m.split("train").num_samples == 7 and m.dims == {"D": 4}
    assert m.splits["train"].shards[0].layout == {"vec.npy": [640, 16], "idx.cls": [1536, 1]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"format": "wdsloader", "version": "1.0", "dims": {"D": ' + "9" * 5000 + "}}", "digits"),
        ('{"format": "wdsloader", "version": "1.0", "splits": {"train": {"shards": [', "Expecting"),
    ],
)
def test_unparsable_json_is_a_manifest_error(tmp_path, text, message):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match=r"manifest\.json: manifest is not valid JSON: "):
        Manifest.load(str(tmp_path))
    with pytest.raises(ManifestError, match=message):
        Manifest.load(str(tmp_path))


def test_field_spec_construction_checks_types():
    with pytest.raises(ManifestError, match=r"FieldSpec\(ext='e\.npy'\)\.shape\[1\]: .* got -1"):
        FieldSpec(ext="e.npy", encoding="npy", dtype="float32", shape=["D", -1])
    with pytest.raises(ManifestError, match=r"FieldSpec\(ext=None\)\.ext: expected a non-empty"):
        FieldSpec(ext=None, encoding="npy")
    with pytest.raises(ManifestError, match=r"\.range: expected \[low, high\], got \[1, 2, 3\]"):
        FieldSpec(ext="x.cls", encoding="cls", range=[1, 2, 3])
    spec = FieldSpec(ext="e.npy", encoding="npy", dtype="float32", shape=(2, "D"), range=(0, 1))
    assert spec.shape == [2, "D"] and spec.range == [0, 1]


# -- random mutations: ManifestError or success, never another exception ------------------------
_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4)
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _positions(node, prefix=()):
    """Every (path to a container, key) in ``node``."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        yield (prefix, key)
        if isinstance(value, dict | list) and value:
            yield from _positions(value, (*prefix, key))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_mutations_give_a_manifest_error_or_a_manifest(data):
    doc = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path, key = data.draw(st.sampled_from(list(_positions(doc))), label="where")
        parent = _at(doc, path)
        action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
        if action == "replace":
            parent[key] = data.draw(_json, label="value")
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=6), label="new key")] = data.draw(_json)
        else:
            parent.append(data.draw(_json, label="appended"))
        if not list(_positions(doc)):
            break
    try:
        m = Manifest.from_dict(doc, source="m.json")
    except ManifestError as exc:
        assert str(exc).startswith("m.json: ")
        return
    again = Manifest.from_dict(json.loads(m.to_json()), source="m.json")
    assert again.to_json() == m.to_json()  # as text: a NaN in free-form fields equals itself


# -- hostile shard paths --------------------------------------------------------------------------
HOSTILE = [
    "train/%2e%2e/%2e%2e/private/secret.tar",
    "train/..%2f..%2fprivate/secret.tar",
    "train/%2E%2E%5C..%5Cprivate/secret.tar",
    "train\\..\\..\\private\\secret.tar",
    "train/../../private/secret.tar",
    "../private/secret.tar",
    "/etc/passwd",
    "train//shard.tar",
    "train/./shard.tar",
    "train/shard.tar/",
    "train/shard\0.tar",
    "http://evil.example/secret.tar",
    "file:/etc/passwd",
    "C:/Windows/secret.tar",
    "simplecache::s3://bucket/secret.tar",
    "train/shard.tar?x=../../private",
    "train/shard.tar#../../x",
    "",
]


@pytest.mark.parametrize("field", ["path", "idx_path"])
@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_shard_paths_are_refused(bad, field):
    doc = _with(lambda d: _shard(d).update({field: bad}))
    where = re.escape(f"splits.train.shards[1].{field}: shard path {bad!r} refused: ")
    with pytest.raises(ManifestError, match=rf"^ds/manifest\.json: {where}.*must be relative"):
        Manifest.from_dict(doc, source="ds/manifest.json")


def test_hostile_path_refused_by_load_and_create_loader(tmp_path):
    root = tmp_path / "ds"
    write_dataset(str(root), {"train": [3, 2]})
    doc = json.loads((root / "manifest.json").read_text())
    doc["splits"]["train"]["shards"][1]["path"] = HOSTILE[0]
    (root / "manifest.json").write_text(json.dumps(doc))
    message = re.escape(f"{root}/manifest.json: splits.train.shards[1].path: shard path ")
    with pytest.raises(ManifestError, match=message + r"'train/%2e%2e/.*percent-encoding"):
        Manifest.load(str(root))
    with pytest.raises(ManifestError, match=message):
        create_loader(str(root), "train", batch_size=2)


@pytest.mark.parametrize("bad", HOSTILE[:3])
def test_over_http_no_byte_outside_the_root_is_requested(http_server, bad):
    www = http_server.root
    (www / "private").mkdir()
    write_dataset(str(www / "private" / "inner"), {"train": [4]})  # a real shard as the secret
    (www / "private" / "secret.tar").write_bytes((www / "private/inner/train/shard-000000.tar")
                                                 .read_bytes())  # fmt: skip
    write_dataset(str(www / "ds"), {"train": [3, 4]})
    doc = json.loads((www / "ds" / "manifest.json").read_text())
    doc["splits"]["train"]["shards"][1]["path"] = bad
    (www / "ds" / "manifest.json").write_text(json.dumps(doc))
    http_server.clear_log()
    for check_shards in (True, False):
        with pytest.raises(
            ManifestError, match=r"splits\.train\.shards\[1\]\.path: shard path .* refused"
        ):
            loader = create_loader(
                f"{http_server.url}/ds", "train", batch_size=2, check_shards=check_shards
            )
            list(loader)
    paths = [r.path for r in http_server.requests()]
    assert paths and all(p == "/ds/manifest.json" for p in paths), paths


def test_cli_info_on_a_malformed_manifest_is_one_line_exit_2(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "manifest.json").write_text(
        json.dumps(_with(lambda d: _shard(d).update(num_samples="abc")))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wdsloader.cli", "info", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"wdsloader: error: {root}/manifest.json: splits.train.shards[1].num_samples: "
        "expected a non-negative integer, got 'abc'\n"
    )


def test_one_integer_check_for_arguments_and_manifest_counts():
    """format.checks.as_int is the integer rule of plan, curriculum and manifest alike."""
    from wdsloader import plan
    from wdsloader.curriculum.schedule import fixed
    from wdsloader.format.checks import as_int, check_count

    assert as_int(np.int64(3), "n", 0) == 3 and type(as_int(np.int64(3), "n")) is int
    for bad in (True, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"^n must be an integer, got "):
            as_int(bad, "n")
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        as_int(0, "n", 1)
    with pytest.raises(ValueError, match=r"^n must be <= 5, got 6$"):
        as_int(6, "n", 0, 5)
    with pytest.raises(
        ValueError, match=r"^x: expected a non-negative integer, got 1208925819614629174706177$"
    ):
        check_count(2**80 + 1, "x")
    assert check_count(np.int64(7), "x") == 7
    cfg = plan.PlanConfig(counts=(4,), batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"^rank must be >= 0, got -1$"):
        plan.worker_batches(cfg, 0, -1, 0)
    with pytest.raises(ValueError, match=r"^counts\[0\] must be an integer, got 4.0$"):
        plan.PlanConfig(counts=(4.0,), batch_size=2, seed=0)
    with pytest.raises(ValueError, match=r"^epoch must be an integer, got 1.5$"):
        fixed([1.0]).probabilities(1.5, ("a",))


# -- required and unknown top-level keys ----------------------------------------------------------
@pytest.mark.parametrize("missing", ["splits", "schema"])
def test_a_manifest_without_splits_or_schema_is_refused(missing):
    doc = _with(lambda d: d.pop(missing))
    with pytest.raises(ManifestError, match=rf"^ds/manifest\.json: missing {missing!r}"):
        Manifest.from_dict(doc, source="ds/manifest.json")


def test_the_cli_refuses_a_manifest_without_splits(tmp_path, capsys):
    from wdsloader.cli import main

    (tmp_path / "manifest.json").write_text('{"format": "wdsloader", "version": "1.0"}')
    for command in ("info", "validate"):
        assert main([command, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"wdsloader: error: {tmp_path}/manifest.json: missing 'schema', 'splits' (a manifest "
            "lists its fields under 'schema' and its shards under 'splits')\n"
        )


def test_unknown_top_level_keys_warn(caplog):
    doc = _with(lambda d: d.update(colour="red", extra=1))
    with caplog.at_level("WARNING", logger="wdsloader"):
        m = Manifest.from_dict(doc, source="ds/manifest.json")
    assert m.num_samples == 7
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "ds/manifest.json: unknown top-level key(s) 'colour', 'extra' ignored; known: "
        "['build', 'dims', 'format', 'loader_defaults', 'schema', 'splits', 'totals', 'version']"
    ]


def test_the_repr_is_short():
    doc = copy.deepcopy(VALID)
    doc["splits"]["train"]["shards"] *= 500
    m = Manifest.from_dict(doc)
    text = repr(m)
    assert SHA not in text and len(text) < 300
    assert text == (
        "Manifest(format='wdsloader 1.0', splits={'train': '3,500 samples in 1,000 shards'}, "
        "fields=['vec', 'steer_a', 'idx', 'meta'], dims={'D': 4})"
    )
    assert str(m) == text


def test_side_files_raise_the_minor_version_and_a_newer_minor_says_upgrade():
    """A manifest whose shards declare side files (key index, lengths and its checksum) is
    written as 1.1 (2.1 when also extended): an older reader refuses it, and this one, given a
    newer minor with a key it does not know, says the manifest is newer, not only the key."""
    plain = Manifest.from_dict(copy.deepcopy(VALID))
    assert plain.to_dict()["version"] == "1.0"

    def side(doc):
        shard = doc["splits"]["train"]["shards"][0]
        shard["keys_path"] = "train/.shard-000000.tar.wdskeys"
        shard["lengths_path"] = "train/.shard-000000.tar.wdslen"
        shard["lengths_sha256"] = SHA

    with_side = Manifest.from_dict(_with(side))
    assert with_side.to_dict()["version"] == "1.1"
    assert with_side.split("train").shards[0].lengths_sha256 == SHA
    assert Manifest.from_dict(with_side.to_dict()).splits == with_side.splits
    with_side.split("train").shards[0].compression = "gzip"
    assert with_side.to_dict()["version"] == "2.1"

    def newer(doc):
        doc["version"] = "2.2"
        doc["splits"]["train"]["shards"][0]["checksums_path"] = "train/.x"

    with pytest.raises(ManifestError) as err:
        Manifest.from_dict(_with(newer))
    assert str(err.value).endswith(
        "(format version 2.2 is newer than this wdsloader reads, 2.1: upgrade wdsloader to read it)"
    )
    assert "train.shards[0]: unknown key(s) 'checksums_path'" in str(err.value)

    def same(doc):
        doc["version"] = "2.1"
        doc["splits"]["train"]["shards"][0]["checksums_path"] = "train/.x"

    with pytest.raises(ManifestError) as err:
        Manifest.from_dict(_with(same))
    assert "newer" not in str(err.value) and "unknown key(s) 'checksums_path'" in str(err.value)
