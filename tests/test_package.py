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
