"""The one rule for progress bars: shown when asked for and stderr is a terminal, never in logs."""

from __future__ import annotations

from typing import Any


def progress_bar(
    *,
    total: int | None = None,
    unit: str = "it",
    unit_scale: bool = False,
    desc: str | None = None,
    enabled: bool = True,
) -> Any:
    """A tqdm bar on stderr. It draws only when ``enabled`` and stderr is a terminal: written to
    a pipe or a file (a job's log), its ``\\r`` frames would fill the log, so it stays silent."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=unit_scale,
        desc=desc,
        disable=None if enabled else True,
        dynamic_ncols=True,
    )
