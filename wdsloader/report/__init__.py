"""A dataset's report page: splits, shards, schema, statistics and previews of a bounded sample
of its rows, build parameters and (when asked) the ``validate`` result, in one HTML file."""

from __future__ import annotations

import os
from typing import Any

from wdsloader.report.collect import DEFAULT_SAMPLES, ReportData, collect_report
from wdsloader.report.page import render_report

__all__ = ["DEFAULT_SAMPLES", "ReportData", "collect_report", "render_report", "write_report"]


def write_report(
    source: str | os.PathLike[str], out: str | os.PathLike[str], **kwargs: Any
) -> ReportData:
    """Write the report page of the dataset at ``source`` to the local file ``out``; keyword
    arguments as for :func:`collect_report`. Returns what the page shows."""
    data = collect_report(source, **kwargs)
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_report(data))
    return data
