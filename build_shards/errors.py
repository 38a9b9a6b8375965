"""Errors of the write side: user errors a caller (or the CLI) reports in one clear line."""

from __future__ import annotations

from typing import TypeVar

from wdsloader.errors import WdsLoaderError

E = TypeVar("E", bound=BaseException)


class BuildError(WdsLoaderError):
    """The build cannot go on because of its input or options (empty source, bad JSONL line,
    duplicate key, unfinished build with other options ...). The message names the file, line,
    sample key or option at fault."""


class OutputExistsError(BuildError, FileExistsError):
    """The output already holds a complete dataset and ``overwrite`` is off."""


class SourceChangedError(BuildError):
    """A rerun of an unfinished build reads other data than the run that wrote its finished
    blocks (same options, same length, other content): resuming would mix the two."""


def naming_options(exc: E, *names: str) -> E:
    """Mark ``exc`` as naming these keyword arguments in its message (as ``name=value``), so that
    a command line can show its own flags in their place; returns ``exc``."""
    exc.options = (*getattr(exc, "options", ()), *names)  # type: ignore[attr-defined]
    return exc
