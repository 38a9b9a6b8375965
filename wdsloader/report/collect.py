"""What a dataset report shows, gathered: the manifest, a bounded sample of every split read by
index, per-field statistics and (when asked) the ``validate`` result."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from wdsloader.access import ShardDataset
from wdsloader.errors import WdsLoaderError
from wdsloader.format import Manifest
from wdsloader.io.manifest_io import load_manifest
from wdsloader.redact import redact, secrets_of
from wdsloader.report.stats import FieldStats, field_stats, sample_indices
from wdsloader.validate.dataset_check import ValidationReport, validate_dataset

log = logging.getLogger(__name__)

DEFAULT_SAMPLES = 200  # rows read per split unless asked otherwise
DEFAULT_PREVIEWS = 8  # rows previewed per split
READ_THREADS = 8  # concurrent sample reads (a remote read is one round trip each)


@dataclasses.dataclass
class SplitSample:
    """The rows read of one split: their indices (in the split), the statistics of each field
    over them, the first rows as they decode (for the previews) and why rows could not be read
    (one line each: a broken shard still gets its report)."""

    name: str
    num_rows: int
    indices: list[int]
    fields: list[FieldStats]
    previews: list[dict[str, Any]]
    seconds: float
    errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReportData:
    """Everything the page shows. ``where`` is the dataset's location with credentials
    masked; ``secrets`` are the credential strings the page must never contain."""

    where: str
    manifest: Manifest
    splits: list[SplitSample]
    samples: int | None
    seed: int
    validation: ValidationReport | None = None
    validation_deep: bool = False
    secrets: tuple[str, ...] = ()


def collect_report(
    source: str | os.PathLike[str],
    *,
    splits: list[str] | None = None,
    samples: int | None = DEFAULT_SAMPLES,
    seed: int = 0,
    previews: int = DEFAULT_PREVIEWS,
    storage_options: dict[str, Any] | None = None,
    validate: bool = False,
    deep: bool = False,
    allow_pickle: bool = False,
) -> ReportData:
    """Read the manifest and ``samples`` rows of each split (default: all splits; None: every
    row) drawn with ``seed``; run :func:`~wdsloader.validate.validate_dataset` when
    ``validate`` (``deep``: every sample decoded too)."""
    root = os.fspath(source)
    secrets = secrets_of(storage_options or {}, root)
    manifest = load_manifest(root, storage_options)
    names = list(manifest.splits) if splits is None else list(splits)
    for name in names:
        manifest.split(name)  # an unknown split: its ManifestError before any read
    data = ReportData(redact(root, secrets), manifest, [], samples, seed, secrets=tuple(secrets))
    for name in names:
        ds = ShardDataset(root, name, storage_options=storage_options, allow_pickle=allow_pickle)
        data.splits.append(read_split(ds, samples, seed, previews))
    if validate:
        data.validation = ValidationReport()
        targets: list[str | None] = [None] if splits is None else list(names)
        for target in targets:
            found = validate_dataset(
                root, target, deep=deep, storage_options=storage_options, allow_pickle=allow_pickle
            )
            data.validation.problems += found.problems
            data.validation.shards_checked += found.shards_checked
            data.validation.samples_checked += found.samples_checked
        data.validation_deep = deep
    return data


def read_split(
    ds: ShardDataset, samples: int | None, seed: int, previews: int = DEFAULT_PREVIEWS
) -> SplitSample:
    """The statistics of ``samples`` rows of ``ds`` (None: all) drawn with ``seed``."""
    t0 = time.perf_counter()
    indices = sample_indices(len(ds), samples, seed)
    with ThreadPoolExecutor(READ_THREADS, "wdsloader-report") as pool:
        got = list(pool.map(lambda i: _read_row(ds, i), indices))
    rows = [r for r in got if isinstance(r, dict)]
    errors = [r for r in got if isinstance(r, str)]
    names = list(ds.manifest.schema) or sorted(
        {k for row in rows for k in row if not k.startswith("__")}
    )
    fields = [
        field_stats(n, ds.manifest.schema.get(n), [row.get(n) for row in rows]) for n in names
    ]
    seconds = time.perf_counter() - t0
    log.info(
        "%s [%s]: read %d of %d samples in %.2f s (%d failed)",
        ds.where, ds.split, len(rows), len(ds), seconds, len(errors),
    )  # fmt: skip
    return SplitSample(ds.split, len(ds), indices, fields, rows[:previews], seconds, errors)


def _read_row(ds: ShardDataset, index: int) -> dict[str, Any] | str:
    """Row ``index`` of ``ds``, or why it could not be read."""
    try:
        return ds[index]
    except (WdsLoaderError, OSError, ValueError) as exc:
        return f"row {index}: {type(exc).__name__}: {redact(exc)}"
