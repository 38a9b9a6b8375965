"""The 2-rank torchrun launches of the tests under real DDP (tests/test_mix_ddp.py,
tests/test_mix_sources_ddp.py, tests/test_mix_tokens_ddp.py, tests/test_pack_loader.py,
tests/test_telemetry.py), shared: a launch costs seconds of interpreter and torch start-up per
process on a 2-core machine, so one launch runs the first phase of every such test module the
session runs, in turn in one process group, and a second launch (a new process group, new
processes) the phase "second" of those that resume there.

Each module has ``PHASES`` (its phases, in order), ``prepare(folder)`` (writes its datasets in
``folder``) and ``scenario(folder, phase)`` (one rank's part of a phase, in the process group;
rank 0 writes every rank's report to ``folder/{phase}.json``).

Run by torchrun as ``python tests/ddp_launch.py --phase PHASE MODULE=FOLDER ...``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from tests.torchrun_harness import run_torchrun


def run_phases(folders: dict[str, Path]) -> dict[str, list[dict]]:
    """Prepare each module's datasets in its folder of ``folders`` ({module name: folder}),
    run each phase in one launch for every module that has it, and return each module's
    reports (one dict per rank: the reports of its phases merged)."""
    modules = {name: importlib.import_module(name) for name in folders}
    for name, module in modules.items():
        module.prepare(folders[name])
    for phase in ("first", "second"):
        specs = [f"{name}={folders[name]}" for name, m in modules.items() if phase in m.PHASES]
        if specs:
            run_torchrun(Path(__file__), "--phase", phase, *specs, cwd=next(iter(folders.values())))
    reports = {}
    for name, module in modules.items():
        phases = [json.loads((folders[name] / f"{p}.json").read_text()) for p in module.PHASES]
        reports[name] = [
            {k: v for r in ranks for k, v in r.items()} for ranks in zip(*phases, strict=True)
        ]
    return reports


def main() -> None:
    import torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["first", "second"], required=True)
    p.add_argument("scenarios", nargs="+", metavar="MODULE=FOLDER")
    args = p.parse_args()
    dist.init_process_group("gloo")
    for spec in args.scenarios:
        name, folder = spec.split("=", 1)
        importlib.import_module(name).scenario(Path(folder), args.phase)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
