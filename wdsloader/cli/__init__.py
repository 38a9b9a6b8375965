"""The ``wdsloader`` command line (info, head, validate, bench) and its throughput
measurement."""

from wdsloader.cli.benchmark import BenchResult, batch_size_of, measure_loader, peak_rss_mb
from wdsloader.cli.commands import main

__all__ = ["BenchResult", "batch_size_of", "main", "measure_loader", "peak_rss_mb"]
