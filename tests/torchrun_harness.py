"""Runs a script under torchrun on this machine (CPU processes that use gloo) for the
distributed tests: ``run_torchrun`` launches and waits; ``start_torchrun`` launches without
waiting, for launches that must run at the same time (two "nodes" of one job).

Each rank's stdout and stderr go to their own files (torchrun's ``--log-dir`` and
``--redirects``), so a run returns each local rank's output and a failure or a timeout shows the
ranks' stderr, rank by rank, next to the launcher's own output.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAIL = 3000  # characters of each output a failure shows
STOP_GRACE = 60  # seconds torchrun may take to stop its ranks after SIGTERM


@dataclass
class Launch:
    """A torchrun started by ``start_torchrun``; ``wait`` returns each local rank's stdout."""

    proc: subprocess.Popen
    nproc: int
    log_dir: Path
    timeout: float
    deadline: float  # time.monotonic() when the launch runs past its timeout

    def wait(self) -> list[str]:
        """Waits for the launch to end; fails (with the ranks' stderr) unless it ends with 0
        within its timeout (counted from its start)."""
        try:
            try:
                left = max(0.0, self.deadline - time.monotonic())
                launcher = self.proc.communicate(timeout=left)[0]
            except subprocess.TimeoutExpired:
                launcher = self._stop()
                raise AssertionError(
                    f"torchrun ran past {self.timeout} s\n{self._failure(launcher)}"
                ) from None
            assert self.proc.returncode == 0, self._failure(launcher)
            return [self._rank_file(r, "stdout.log") for r in range(self.nproc)]
        finally:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _stop(self) -> str:
        """Ends a launch that ran past its timeout and returns the launcher's output: torchrun
        stops the ranks it started (each in a session of its own) on SIGTERM; SIGKILL after."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return str(self.proc.communicate(timeout=STOP_GRACE)[0])
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return str(self.proc.communicate()[0])

    def _rank_file(self, local_rank: int, name: str) -> str:
        """One output of a local rank (its last attempt); "" when it wrote none."""
        found = sorted(self.log_dir.glob(f"*/attempt_*/{local_rank}/{name}"))
        return found[-1].read_text(errors="replace") if found else ""

    def _failure(self, launcher: str) -> str:
        ranks = [
            f"--- local rank {r} stderr:\n{self._rank_file(r, 'stderr.log')[-TAIL:]}"
            for r in range(self.nproc)
        ]
        return "\n".join(
            [f"--- torchrun (exit {self.proc.returncode}):\n{launcher[-TAIL:]}", *ranks]
        )


def start_torchrun(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    launcher_args: tuple[str, ...] = ("--standalone",),
    cwd: Path | None = None,
    timeout: float = 300,
) -> Launch:
    """Starts ``python -m torch.distributed.run --nproc_per_node=NPROC LAUNCHER_ARGS SCRIPT
    ARGS`` with this checkout first on PYTHONPATH and one OpenMP thread per rank."""
    log_dir = Path(tempfile.mkdtemp(prefix="torchrun-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           *launcher_args, f"--log-dir={log_dir}", "--redirects=3", str(script), *args]  # fmt: skip
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return Launch(proc, nproc, log_dir, timeout, time.monotonic() + timeout)


def run_torchrun(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    launcher_args: tuple[str, ...] = ("--standalone",),
    cwd: Path | None = None,
    timeout: float = 300,
) -> list[str]:
    """Runs SCRIPT under torchrun on NPROC local ranks and returns each rank's stdout; fails
    with every rank's stderr when a rank fails or the run passes ``timeout`` seconds."""
    launch = start_torchrun(
        script, *args, nproc=nproc, launcher_args=launcher_args, cwd=cwd, timeout=timeout
    )
    return launch.wait()
