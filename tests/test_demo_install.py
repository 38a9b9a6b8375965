"""`make demo` installs the package and its base requirements only, and the demo runs with
nothing else importable (every extra of the test stack hidden, in worker processes too)."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
BASE = {"numpy", "torch", "fsspec", "tqdm"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _closure(names: set[str]) -> set[str]:
    """The distributions ``names`` need, transitively, ignoring requirements behind extras."""
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if "extra ==" not in r.replace('"', " ")]
    return seen


def test_base_requirements_are_the_four_the_demo_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} == BASE


def test_make_demo_installs_no_extras():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("$(DEMO_STAMP):", 1)[1].split("\n\n", 1)[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert installs and all("[" not in line for line in installs), installs
    assert re.search(r"^demo: \$\(DEMO_STAMP\)$", make, re.M), (
        "demo must not depend on the test stack"
    )


@pytest.mark.slow  # runs the demo in its own processes
def test_demo_runs_with_only_base_requirements(tmp_path):
    allowed = {n.replace("-", "_") for n in _closure(BASE)} | {"wdsloader"}
    blocked = sorted(
        mod
        for mod, dists in md.packages_distributions().items()
        if not any(d.lower().replace("-", "_") in allowed for d in dists)
        and not mod.startswith("_")
        and mod not in {"pip", "setuptools", "pkg_resources", "wdsloader", "build_shards"}
    )
    assert (
        "ray" in blocked and "datasets" in blocked and "msgspec" in blocked
    )  # the stack is hidden
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "base_deps_only"), str(ROOT)]),
        "BASE_DEPS_ONLY_BLOCKED": ",".join(blocked),
    }
    script = ROOT / "examples" / "demo.py"
    args = ["--out", str(tmp_path / "o"), "--samples", "600", "--workers", "2"]
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical to an uninterrupted epoch: True" in proc.stdout
