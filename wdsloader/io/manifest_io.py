"""``manifest.json`` in storage: read and write a dataset's manifest under a folder or URL.

The manifest's content (:class:`wdsloader.format.manifest.Manifest`) is the on-disk contract and
imports nothing above it; reading and writing it through fsspec, with set-up mistakes in one line,
is this layer's job. ``Manifest.load`` and ``Manifest.save`` delegate here (importing this module
plugs them in; ``import wdsloader`` does).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from wdsloader.errors import ManifestError, StorageSetupError
from wdsloader.format import manifest as _contract
from wdsloader.format.manifest import Manifest
from wdsloader.format.version import MANIFEST_NAME
from wdsloader.io.setup_errors import setup_errors_in_one_line
from wdsloader.io.storage import join, url_to_fs, write_atomic
from wdsloader.redact import redact, secrets_of


def save_manifest(
    manifest: Manifest,
    root: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write ``manifest.json`` atomically under ``root``; returns its path."""
    manifest.check_paths()
    fs, path = url_to_fs(root, storage_options)
    target = join(path, MANIFEST_NAME)
    write_atomic(fs, target, manifest.to_json().encode())
    return target


def load_manifest(
    root: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    *,
    read: Callable[[str], bytes] | None = None,
) -> Manifest:
    """Read ``manifest.json`` under ``root`` (a folder or URL), with clear errors. ``read``
    (given a path under ``root``, its bytes) reads it instead of a filesystem opened here:
    a store's client, its errors worded the same way."""
    if read is None:
        fs, path = url_to_fs(root, storage_options)
        read = functools.partial(_read_under, fs, path)
    secrets = secrets_of(storage_options, os.fspath(root))
    where = manifest_where(root, storage_options)
    try:
        with setup_errors_in_one_line(
            f"{os.fspath(root).rstrip('/')}/{MANIFEST_NAME}", storage_options
        ):
            raw = read(MANIFEST_NAME)
    except StorageSetupError:
        raise
    except FileNotFoundError:
        raise ManifestError(
            f"{where}: manifest not found (is this a wdsloader dataset, and did its build "
            "finish? `build-shards adopt` makes one for existing shards)"
        ) from None
    except OSError as exc:
        raise ManifestError(f"{where}: manifest unreadable: {redact(exc, secrets)}") from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ManifestError(f"{where}: manifest is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 5000 digits
        raise ManifestError(f"{where}: manifest is not valid JSON: {exc}") from None
    return Manifest.from_dict(data, source=where)


def _read_under(fs: Any, path: str, rel: str) -> bytes:
    return cat_whole(fs, join(path, rel))


def cat_whole(fs: Any, path: str) -> bytes:
    """The whole file at ``path`` in one GET: s3fs otherwise asks the size first (a HEAD, and
    a LIST where the HEAD finds nothing) to split a large file into concurrent parts."""
    if getattr(fs, "max_concurrency", None) is not None:  # s3fs
        data: bytes = fs.cat_file(path, max_concurrency=1)
        return data
    whole: bytes = fs.cat_file(path)
    return whole


def manifest_where(
    root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> str:
    """How messages name the manifest under ``root``: its URL, credentials redacted."""
    shown = f"{os.fspath(root).rstrip('/')}/{MANIFEST_NAME}"
    return redact(shown, secrets_of(storage_options, os.fspath(root)))


_contract.plug_storage(load_manifest, save_manifest)
