"""Errors of the write side: user errors a caller (or the CLI) reports in one clear line."""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from wdsloader.errors import SchemaError, WdsLoaderError

E = TypeVar("E", bound=BaseException)


class BuildError(WdsLoaderError):
    """The build cannot go on because of its input or options (empty source, bad JSONL line,
    duplicate key, unfinished build with other options ...). The message names the file, line,
    sample key or option at fault."""


class OutputExistsError(BuildError, FileExistsError):
    """The output already holds a complete dataset and ``overwrite`` is off."""


class SampleKeyError(BuildError, SchemaError):
    """A sample key the shards cannot hold or readers would not give back unchanged (a dot, a
    leading ``_``, too long, not UTF-8). The message names the source item, key and key field."""


class BuildWorkerError(WdsLoaderError, BrokenProcessPool):
    """A build worker process died (killed by a signal, out of memory, or stopped as it started
    because the main script has no ``if __name__ == "__main__":`` guard). The blocks finished
    before stay recorded: a rerun with the same options resumes."""


class SourceChangedError(BuildError):
    """A rerun of an unfinished build reads other data than the run that wrote its finished
    blocks (same options, same length, other content): resuming would mix the two."""


def naming_options(exc: E, *names: str) -> E:
    """Mark ``exc`` as naming these keyword arguments in its message (as ``name=value``), so that
    a command line can show its own flags in their place; returns ``exc``."""
    exc.options = (*getattr(exc, "options", ()), *names)  # type: ignore[attr-defined]
    return exc
