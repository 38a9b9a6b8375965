"""``make docs``: the docs site builds with ``mkdocs build --strict`` (every warning is an error),
and its API reference holds every public name of ``wdsloader`` and ``build_shards``.

Needs the docs packages of the ``test`` extra (mkdocs, mkdocs-material, mkdocstrings[python]).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = pathlib.Path(__file__).resolve().parent.parent


def mkdocs_build(root: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project at ``root`` into ``site``, as ``make docs`` runs it."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # ~20 s: the whole site and the API reference (imports torch)
def test_the_docs_build_strictly_with_every_public_name(tmp_path):
    import build_shards
    import wdsloader

    proc = mkdocs_build(ROOT, tmp_path / "site")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "WARNING" not in out, out[-3000:]
    for package in (wdsloader, build_shards):
        html = (tmp_path / "site" / "reference" / package.__name__ / "index.html").read_text()
        shown = {h.rsplit(".", 1)[-1] for h in re.findall(r'<h3 id="([\w.]+)"', html)}
        assert sorted(set(package.__all__) - shown) == []


def test_a_warning_fails_the_build(tmp_path):
    """A broken link is a warning of mkdocs; the strict build stops on it and names the page."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    for page in (root / "docs" / "reference").glob("*.md"):  # no API blocks: a fast build
        page.write_text(f"# {page.stem}\n")
    index = root / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
    proc = mkdocs_build(root, tmp_path / "site")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "Doc file 'index.md' contains a link 'no-such-page.md'" in out
    assert "Aborted with 1 warnings in strict mode!" in out
