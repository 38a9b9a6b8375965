"""The package surface: public names resolve, and importing the format layer stays light."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wdsloader


def test_every_public_name_resolves():
    for name in wdsloader.__all__:
        assert getattr(wdsloader, name) is not None, name


def test_format_layer_does_not_import_torch():
    code = "import sys, wdsloader, wdsloader.format, build_shards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_classes_are_ours_and_the_common_ones_top_level():
    """Every error class is a WdsLoaderError in ``wdsloader.errors``; the top level holds the
    base and those a training loop catches. BatchValidationError stays an AssertionError (seed
    code catches that) and ShardReadError an OSError."""
    from wdsloader import errors

    classes = [
        v for v in vars(errors).values() if isinstance(v, type) and v.__module__ == errors.__name__
    ]
    assert all(issubclass(c, wdsloader.WdsLoaderError) for c in classes)
    top = {"WdsLoaderError", "ShardReadError", "SkipLimitError", "StateMismatchError"}
    assert top | {"WorkerDiedError"} <= set(wdsloader.__all__)
    assert issubclass(errors.BatchValidationError, AssertionError)
    assert issubclass(wdsloader.ShardReadError, OSError)
    assert wdsloader.validate.BatchValidationError is errors.BatchValidationError


# Names that left the top level, and the subpackage each is imported from now.
MOVED = {
    "ShardStreamDataset": "wdsloader.stream",
    "LoaderConfig": "wdsloader.stream",
    "PlanConfig": "wdsloader.plan",
    "Resume": "wdsloader.plan",
    "ShardStore": "wdsloader.io",
    "SampleDecoder": "wdsloader.decode",
    "get_decoder": "wdsloader.decode",
    "parse_sample": "wdsloader.decode",
    "register_decoder": "wdsloader.decode",
    "FieldSpec": "wdsloader.format",
    "Manifest": "wdsloader.format",
    "ShardInfo": "wdsloader.format",
    "SplitInfo": "wdsloader.format",
    "Schedule": "wdsloader.curriculum",
    "EpochLengthPolicy": "wdsloader.mix",
    "ProfileResult": "wdsloader.training",
    "DecodeError": "wdsloader.errors",
    "ManifestError": "wdsloader.errors",
    "PickleNotAllowedError": "wdsloader.errors",
    "SchemaError": "wdsloader.errors",
    "ShardFormatError": "wdsloader.errors",
    "StorageSetupError": "wdsloader.errors",
    "BatchValidationError": "wdsloader.errors",
}


def test_public_face_is_small_and_holds_no_internals():
    assert len(wdsloader.__all__) <= 41  # 41: Packing, the option object of create_loader(packing=)
    assert not set(MOVED) & set(wdsloader.__all__)
    assert not set(MOVED) & set(dir(wdsloader))


@pytest.mark.parametrize("name", sorted(MOVED))
def test_moved_name_warns_and_resolves_to_the_same_object(name):
    module = MOVED[name]
    new = getattr(importlib.import_module(module), name)
    match = (
        re.escape(f"wdsloader.{name} is deprecated")
        + ".*"
        + re.escape(f"`from {module} import {name}`")
    )
    with pytest.warns(DeprecationWarning, match=match) as record:
        assert getattr(wdsloader, name) is new
    assert record[0].filename == __file__  # the warning points at the code that read the name
    with pytest.warns(DeprecationWarning, match=match):  # every read warns, not only the first
        exec(f"from wdsloader import {name}", {})


def test_public_names_resolve_without_a_warning():
    """In a fresh interpreter, so that no name is already cached in the package."""
    code = (
        "import warnings, wdsloader\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    for name in wdsloader.__all__:\n"
        "        getattr(wdsloader, name)\n"
        "print([str(w.message) for w in seen if 'wdsloader' in str(w.message)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_ticket_names_in_the_packages():
    """Docstrings, comments and messages say what a thing is ("the training-engine data module"),
    not which internal ticket asked for it ("seed 001", "issue 14", "stop 17")."""
    import build_shards

    jargon = re.compile(r"\bseeds? ?0\d\d\b|\bissue ?#?\d+|\bstop \d+|\bbug \d{3,}", re.IGNORECASE)
    found = []
    for package in (wdsloader, build_shards):
        for path in sorted(Path(package.__file__).parent.rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if jargon.search(line):
                    found.append(f"{path.name}:{n}: {line.strip()}")
    assert found == []


def test_build_shards_adopt_is_the_function():
    """``from build_shards import adopt`` gives the function (like ``build_shards``), and the
    module still imports by its dotted name."""
    code = (
        "import inspect, sys\n"
        "from build_shards import adopt\n"
        "import build_shards.adopt\n"
        "from build_shards.adopt import adopt as same\n"
        "assert inspect.isfunction(adopt), adopt\n"
        "assert adopt is same is sys.modules['build_shards.adopt'].adopt\n"
        "import build_shards\n"
        "assert build_shards.adopt is adopt and 'adopt' in build_shards.__all__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
