"""The ``wdsloader`` command line (info, head, validate, bench), its throughput measurement and
the one progress-bar rule the command lines share."""

from wdsloader.cli.benchmark import BenchResult, batch_size_of, measure_loader, peak_rss_mb
from wdsloader.cli.commands import main
from wdsloader.cli.progress import progress_bar

__all__ = ["BenchResult", "batch_size_of", "main", "measure_loader", "peak_rss_mb", "progress_bar"]
