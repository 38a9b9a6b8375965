"""The output folder of a build: existing datasets, the resume state under ``_build/``, clean-up.

``_build/build.json`` holds the build's fingerprint (a hash of the options, the source's identity
and the inferred schema), the name prefix of its shards and whether it replaces a complete dataset;
``_build/block-BBBBB.json`` records a finished block. A rerun with the same fingerprint keeps the
finished blocks whose shards are all present (the caller then checks their first and last items
against its source); the manifest is written last and ``_build/`` removed after it.

A complete dataset in the folder is never touched before its replacement is complete: every
removal spares the files its manifest lists, the new shards take the other name prefix, and the
old files go only after the new manifest replaced the old one.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from typing import Any

from build_shards.commit.card import write_card
from build_shards.errors import BuildError, OutputExistsError, naming_options
from build_shards.write.paths import (
    BUILD_DIR,
    LEGACY_PREFIXES,
    RECORD_RE,
    SHARD_PREFIXES,
    SPLIT_FIELD,
    TMP_MARK,
    build_file_path,
    record_path,
    shard_files,
)
from build_shards.write.records import BlockRecord, RecordError
from wdsloader.errors import WdsLoaderError
from wdsloader.format import INDEX_SUFFIX, MANIFEST_NAME, Manifest
from wdsloader.format.keyindex import KEYS_SUFFIX
from wdsloader.format.lengths import LENGTHS_SUFFIX
from wdsloader.io.manifest_io import load_manifest, save_manifest
from wdsloader.io.setup_errors import setup_errors_in_one_line
from wdsloader.io.storage import is_local, join, write_atomic
from wdsloader.redact import redact, secrets_of

log = logging.getLogger("build_shards")

# a shard, its index (hidden ``.X.tar.wdsidx``, or ``X.tar.idx`` of the legacy prefixes), its key
# index (hidden ``.X.tar.wdskeys``), its lengths (hidden ``.X.tar.wdslen``) or their temporary
# files; the stem is checked against the folder's split by :func:`_name_stem`
_HIDDEN = f"({re.escape(INDEX_SUFFIX)}|{re.escape(KEYS_SUFFIX)}|{re.escape(LENGTHS_SUFFIX)})"
_OURS = re.compile(
    r"^(?P<hidden>\.)?(?P<stem>.+?)-\d{5,}-\d{3,}\.tar(\.gz)?"
    rf"(?(hidden){_HIDDEN}|(?P<legacy_idx>\.idx)?)(\.tmp-[0-9a-f]+)?$"
)


def _name_stem(path: str) -> str | None:
    """The name prefix of one of our shard files at ``path`` (``{split}`` where the split's name
    is), or None for a file that is not ours."""
    m = _OURS.match(posixpath.basename(path))
    if m is None:
        return None
    split = posixpath.basename(posixpath.dirname(path))
    stems = {p.replace(SPLIT_FIELD, split): p for p in SHARD_PREFIXES}
    if m.group("legacy_idx") is None and m.group("stem") in stems:
        return stems[m.group("stem")]
    return m.group("stem") if m.group("stem") in LEGACY_PREFIXES else None


class OutputState:
    """Reads and changes what a build owns under ``root`` on ``fs``."""

    def __init__(
        self, fs: Any, root: str, url: str, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.fs, self.root, self.url = fs, root, url.rstrip("/")
        self.storage_options = storage_options
        self.prefix = SHARD_PREFIXES[0]  # of this build's shard names (set by resume)
        self.replaces = False  # this build replaces a complete dataset (set by resume)
        self._protected: set[str] | None = None

    # -- queries -----------------------------------------------------------------------------
    def has_manifest(self) -> bool:
        """Whether the output holds a manifest (a build's first look at its output: a missing
        bucket or a dead endpoint is a StorageSetupError here)."""
        self.fs.invalidate_cache()
        with setup_errors_in_one_line(self.url, fs=self.fs):
            return bool(self.fs.exists(join(self.root, MANIFEST_NAME)))

    def _our_files(self) -> list[str]:
        """Shard, index and temporary files of our naming patterns in the split folders."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.glob(join(self.root, "*", "*"))
        except FileNotFoundError:
            return []
        return sorted(p for p in found if _name_stem(p) is not None)

    def protected(self) -> set[str]:
        """The files the complete dataset in the folder lists (its manifest's shards and
        indexes): no removal touches them until a new manifest has replaced it."""
        if self._protected is None:
            self._protected = set()
            if self.has_manifest():
                try:
                    old = load_manifest(self.url, self.storage_options)
                except (WdsLoaderError, OSError, ValueError) as exc:
                    log.warning("the old manifest of %s is unreadable (%s)", self.url, exc)
                else:
                    self._protected = {
                        join(self.root, p)
                        for split in old.splits.values()
                        for shard in split.shards
                        for p in shard_files(shard)
                    }
        return self._protected

    def _build_file(self) -> dict[str, Any] | None:
        """``_build/build.json`` of an unfinished build, or None."""
        path = build_file_path(self.root)
        self.fs.invalidate_cache()
        if not self.fs.exists(path):
            return None
        try:
            body = json.loads(self.fs.cat_file(path))
        except (OSError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def _rm(self, paths: list[str] | set[str]) -> None:
        for path in sorted(paths):
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    def _rm_ours(self, *, temporary_only: bool = False) -> None:
        """Remove our shard files (or only the temporary ones), except the complete dataset's."""
        spare = self.protected()
        self._rm(
            [
                p
                for p in self._our_files()
                if p not in spare and (not temporary_only or TMP_MARK in posixpath.basename(p))
            ]
        )

    def _rm_build_dir(self) -> None:
        path = join(self.root, BUILD_DIR)
        self.fs.invalidate_cache()
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def _prune_dirs(self) -> None:
        """Remove split folders left empty (local filesystems only; object stores have none)."""
        if not is_local(self.fs) or not self.fs.isdir(self.root):
            return
        for entry in self.fs.ls(self.root, detail=True):
            if entry["type"] == "directory" and not self.fs.ls(entry["name"]):
                self.fs.rmdir(entry["name"])

    # -- start ---------------------------------------------------------------------------------
    def check_existing(self, overwrite: bool, fingerprint: str | None = None) -> None:
        """Refuse a complete dataset unless ``overwrite``, or unless an unfinished build that
        replaces it (started with ``overwrite``, same ``fingerprint`` when given) is resumed."""
        if overwrite or not self.has_manifest():
            return
        previous = self._build_file()
        if (
            previous
            and previous.get("replaces")
            and fingerprint in (None, previous.get("fingerprint"))
        ):
            return
        raise naming_options(
            OutputExistsError(
                f"{self.url} already holds a complete dataset ({MANIFEST_NAME}); pass "
                "overwrite=True to replace it"
            ),
            "overwrite",
        )

    def resume(
        self, fingerprint: str, options: dict[str, Any], overwrite: bool
    ) -> dict[int, BlockRecord]:
        """Finished block records to keep (empty for a fresh build); writes ``build.json``.

        ``overwrite`` starts over: the unfinished build is removed (the complete dataset stays
        until the new one replaces it). Else an unfinished build with another fingerprint is
        refused, and one with the same fingerprint resumed.
        """
        previous = self._build_file()
        kept: dict[int, BlockRecord] = {}
        if previous is not None and previous.get("fingerprint") == fingerprint and not overwrite:
            kept = self._load_records(fingerprint)
            self.prefix = previous.get("prefix", SHARD_PREFIXES[0])
            self.replaces = bool(previous.get("replaces"))
            log.info("resuming the build in %s: %d finished blocks kept", self.url, len(kept))
        elif previous is not None and not overwrite:
            before = previous.get("options", {})
            differ = sorted(
                k for k in set(options) | set(before) if options.get(k) != before.get(k)
            )
            raise naming_options(
                BuildError(
                    f"{self.url} holds an unfinished build with other options or input "
                    f"(differing: {', '.join(differ) or 'unknown'}); rerun with the same options "
                    "to resume it, or pass overwrite=True to start over"
                ),
                "overwrite",
            )
        else:
            self._rm_ours()
            self._rm_build_dir()
            self.prefix = self._free_prefix()
            self.replaces = self.has_manifest()
        if previous is None or overwrite or previous.get("fingerprint") != fingerprint:
            body = {
                "fingerprint": fingerprint,
                "options": options,
                "prefix": self.prefix,
                "replaces": self.replaces,
            }
            write_atomic(self.fs, build_file_path(self.root), json.dumps(body, indent=1).encode())
        return kept

    def clear_temporary(self) -> None:
        """Remove the temporary files a crashed build left (not those of a complete dataset)."""
        self._rm_ours(temporary_only=True)

    def _free_prefix(self) -> str:
        """The first shard name prefix the complete dataset in the folder does not use."""
        used = {_name_stem(p) for p in self.protected()}
        for prefix in SHARD_PREFIXES:
            if prefix not in used:
                return prefix
        raise BuildError(
            f"{self.url}: the complete dataset there uses every shard name prefix "
            f"{SHARD_PREFIXES}: the new shards cannot be written beside it"
        )

    def _load_records(self, fingerprint: str) -> dict[int, BlockRecord]:
        out: dict[int, BlockRecord] = {}
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(join(self.root, BUILD_DIR), detail=False)
        except FileNotFoundError:
            return out
        for path in sorted(entries):
            m = RECORD_RE.match(posixpath.basename(path))
            if not m:
                continue
            try:
                rec = BlockRecord.from_json(self.fs.cat_file(path))
            except OSError:
                continue
            except RecordError as exc:
                log.warning("block record %s is unreadable (%s): redoing its block", path, exc)
                continue
            if (
                rec.fingerprint != fingerprint
                or rec.block != int(m.group(1))
                or not self._shards_present(rec)
            ):
                log.warning("block record %s is stale or its shards are missing: redoing it", path)
                continue
            out[rec.block] = rec
        return out

    def _shards_present(self, rec: BlockRecord) -> bool:
        for s in rec.all_shards():
            try:
                if self.fs.size(join(self.root, s.path)) != s.num_bytes:
                    return False
                if not all(self.fs.exists(join(self.root, p)) for p in shard_files(s)[1:]):
                    return False
            except FileNotFoundError:
                return False
        return True

    def record_keys(self, block: int) -> dict[str, list[str]]:
        """The keys a finished block's record lists per split (to name a duplicate)."""
        rec = BlockRecord.from_json(self.fs.cat_file(record_path(self.root, block)))
        return {split: list(keys) for split, keys in (rec.keys or {}).items()}

    # -- end -------------------------------------------------------------------------------------
    def finalize(self, manifest: Manifest) -> None:
        """Write the manifest (last: this switches a replaced dataset to the new one), then
        remove the replaced dataset's files, stray shard files and ``_build/``; then the dataset
        card (see :mod:`build_shards.commit.card`)."""
        listed = {
            join(self.root, p)
            for split in manifest.splits.values()
            for s in split.shards
            for p in shard_files(s)
        }
        save_manifest(manifest, self.url, self.storage_options)
        old = self.protected() - listed
        stray = [p for p in self._our_files() if p not in listed]
        if old or stray:
            log.info("removing %d files of the replaced dataset or stray", len(old | set(stray)))
        self._protected = set()
        self._rm(old | set(stray))
        self._rm_build_dir()
        self._prune_dirs()
        display = redact(self.url, secrets_of(self.storage_options, self.url))
        write_card(self.fs, self.root, display, manifest)

    def discard(self) -> None:
        """After a user error: remove everything this unfinished build wrote (the complete
        dataset it would replace stays)."""
        self._rm_ours()
        self._rm_build_dir()
        self._prune_dirs()
