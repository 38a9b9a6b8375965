"""The package surface: public names resolve, and importing the format layer stays light."""

import subprocess
import sys

import wdsloader


def test_every_public_name_resolves():
    for name in wdsloader.__all__:
        assert getattr(wdsloader, name) is not None, name


def test_format_layer_does_not_import_torch():
    code = "import sys, wdsloader, wdsloader.format, build_shards; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_classes_are_exported_and_ours():
    """Every error class is a top-level name and a WdsLoaderError; BatchValidationError stays an
    AssertionError (seed code catches that) and ShardReadError an OSError."""
    from wdsloader import errors

    classes = [
        v for v in vars(errors).values() if isinstance(v, type) and v.__module__ == errors.__name__
    ]
    assert {c.__name__ for c in classes} <= set(wdsloader.__all__)
    assert all(issubclass(c, wdsloader.WdsLoaderError) for c in classes)
    assert issubclass(wdsloader.BatchValidationError, AssertionError)
    assert issubclass(wdsloader.ShardReadError, OSError)
    assert wdsloader.validate.BatchValidationError is wdsloader.BatchValidationError


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
