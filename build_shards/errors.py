"""Errors of the write side: user errors a caller (or the CLI) reports in one clear line."""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool

from wdsloader.errors import SchemaError, WdsLoaderError


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
