"""The check of the tests that exit the interpreter with an iteration open: a script run in a
fresh interpreter exits with status 0 and nothing on stderr of an abort, an ignored exception
or a traceback."""

from __future__ import annotations

import subprocess
import sys

EXIT_FAILURES = ("terminate called", "Exception ignored", "Traceback")


def assert_exits_cleanly(script: str, runs: int = 1) -> str:
    """Run ``script`` ``runs`` times in a fresh interpreter and check each exit; the last run's
    stdout."""
    out = ""
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        for failure in EXIT_FAILURES:
            assert failure not in proc.stderr, proc.stderr
        out = proc.stdout
    return out
