"""A dataset's report page: splits, shards, schema, statistics and previews of a bounded sample
of its rows, build parameters and (when asked) the ``validate`` result, in one HTML file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from wdsloader.report.collect import DEFAULT_SAMPLES, ReportData, collect_report
from wdsloader.report.page import render_report, render_reports

__all__ = [
    "DEFAULT_SAMPLES",
    "ReportData",
    "collect_report",
    "render_report",
    "render_reports",
    "write_report",
    "write_reports",
]


def write_report(
    source: str | os.PathLike[str], out: str | os.PathLike[str], **kwargs: Any
) -> ReportData:
    """Write the report page of the dataset at ``source`` to the local file ``out``; keyword
    arguments as for :func:`collect_report`. Returns what the page shows."""
    data = collect_report(source, **kwargs)
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_report(data))
    return data


def write_reports(
    sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], **kwargs: Any
) -> list[ReportData]:
    """Write one page with the report of each dataset of ``sources`` (e.g. the sources of a
    mix), a section each (:func:`~wdsloader.report.page.render_reports`), to the local file
    ``out``; keyword arguments as for :func:`collect_report`, for every dataset."""
    datas = [collect_report(source, **kwargs) for source in sources]
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_reports(datas))
    return datas
