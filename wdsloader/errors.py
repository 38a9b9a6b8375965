"""Exceptions raised by wdsloader and build_shards. Messages name the file, shard, key and field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class WdsLoaderError(Exception):
    """Base class of every error this project raises on purpose."""


class ManifestError(WdsLoaderError):
    """A manifest is missing, unreadable, invalid or of a newer major format version."""


class ShardFormatError(WdsLoaderError):
    """A shard or its index is corrupt, truncated or does not match the manifest."""


class ShardReadError(WdsLoaderError, OSError):
    """Reading a shard failed for good: retries exhausted or a non-transient storage error."""


class StorageSetupError(WdsLoaderError, OSError):
    """The storage cannot be used as configured: a missing bucket, an endpoint that does not
    answer, missing or refused credentials. The message is one line naming the URL (credentials
    redacted) and what to check."""


class SchemaError(WdsLoaderError, ValueError):
    """A sample does not match the declared or inferred schema."""


class DecodeError(WdsLoaderError):
    """A field could not be decoded (names shard, sample key and field)."""


class PickleNotAllowedError(DecodeError):
    """A pickle-based field was met and ``allow_pickle`` is off."""


class StateMismatchError(WdsLoaderError, ValueError):
    """A loader state is malformed or belongs to another dataset, split or plan (names the part)."""


class SkipLimitError(WdsLoaderError, RuntimeError):
    """``on_error="skip"`` skipped more than ``max_skipped`` samples in one pass, or found no
    sample it could decode (names the count and the last error)."""


class WorkerDiedError(WdsLoaderError, RuntimeError):
    """A DataLoader worker process died (names the worker, its pid, exit code or signal and
    the shard it was reading when known)."""


class BatchValidationError(WdsLoaderError, AssertionError):
    """A batch does not match the dataset's schema (an AssertionError too, as
    ``validate_batch(...)`` is used like an assert).

    The message names the field, the rule, the offending value and the sample key(s); ``field``
    (None when the problem is not one field's), ``rule`` and ``keys`` (the offending samples'
    keys, ``#row`` where the batch has no ``__key__``) hold them too.
    """

    def __init__(
        self, message: str, *, field: str | None = None, rule: str = "", keys: Iterable[str] = ()
    ) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule
        self.keys = list(keys)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args, self.__dict__)
