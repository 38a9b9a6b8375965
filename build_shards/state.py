"""The output folder of a build: existing datasets, the resume state under ``_build/``, clean-up.

``_build/build.json`` holds the build's fingerprint (a hash of the options, the source's identity
and the inferred schema) from the start; ``_build/block-BBBBB.json`` records a finished block. A
rerun with the same fingerprint keeps the finished blocks whose shards are all present; the
manifest is written last and ``_build/`` removed after it.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from typing import Any

from build_shards.errors import BuildError, OutputExistsError
from build_shards.writer import BUILD_DIR, TMP_MARK
from wdsloader.format import MANIFEST_NAME, Manifest
from wdsloader.storage import is_local, join, write_atomic

log = logging.getLogger("build_shards")

BUILD_FILE = "build.json"
_OURS = re.compile(r"^shard-\d{5,}-\d{3,}\.tar(\.idx)?(\.tmp-[0-9a-f]+)?$")
_RECORD = re.compile(r"^block-(\d{5,})\.json$")


class OutputState:
    """Reads and changes what a build owns under ``root`` on ``fs``."""

    def __init__(
        self, fs: Any, root: str, url: str, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.fs, self.root, self.url = fs, root, url.rstrip("/")
        self.storage_options = storage_options

    # -- queries -----------------------------------------------------------------------------
    def has_manifest(self) -> bool:
        return bool(self.fs.exists(join(self.root, MANIFEST_NAME)))

    def _our_files(self) -> list[str]:
        """Shard, index and temporary files of our naming pattern in the split folders."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.glob(join(self.root, "*", "shard-*"))
        except FileNotFoundError:
            return []
        return sorted(p for p in found if _OURS.match(posixpath.basename(p)))

    def _rm(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

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
    def check_existing(self, overwrite: bool) -> None:
        """Refuse a complete dataset unless ``overwrite``."""
        if self.has_manifest() and not overwrite:
            raise OutputExistsError(
                f"{self.url} already holds a complete dataset ({MANIFEST_NAME}); pass "
                "overwrite=True (--overwrite) to replace it"
            )

    def remove_dataset(self) -> None:
        """Remove a complete dataset: its manifest first, then the files it lists and ours."""
        listed: list[str] = []
        if self.has_manifest():
            try:
                old = Manifest.load(self.url, self.storage_options)
                for split in old.splits.values():
                    for shard in split.shards:
                        listed += [join(self.root, shard.path), join(self.root, shard.idx_path)]
            except Exception as exc:  # an unreadable old manifest still gets removed
                log.warning("old manifest unreadable (%s); removing our shard files only", exc)
            self._rm([join(self.root, MANIFEST_NAME)])
        self._rm(listed + self._our_files())
        self._rm_build_dir()

    def resume(self, fingerprint: str, options: dict[str, Any], overwrite: bool) -> dict[int, Any]:
        """Finished block records to keep (empty for a fresh build); writes ``build.json``."""
        build_file = join(self.root, BUILD_DIR, BUILD_FILE)
        kept: dict[int, Any] = {}
        if self.fs.exists(build_file):
            try:
                previous = json.loads(self.fs.cat_file(build_file))
            except (OSError, ValueError):
                previous = {}
            if previous.get("fingerprint") == fingerprint and not overwrite:
                kept = self._load_records(fingerprint)
                log.info("resuming the build in %s: %d finished blocks kept", self.url, len(kept))
            elif not overwrite:
                differ = sorted(
                    k
                    for k in set(options) | set(previous.get("options", {}))
                    if options.get(k) != previous.get("options", {}).get(k)
                )
                raise BuildError(
                    f"{self.url} holds an unfinished build with other options or input "
                    f"(differing: {', '.join(differ) or 'unknown'}); rerun with the same options "
                    "to resume it, or pass overwrite=True (--overwrite) to start over"
                )
            else:
                self._rm(self._our_files())
                self._rm_build_dir()
        elif overwrite:
            self._rm(self._our_files())
        self._rm([p for p in self._our_files() if TMP_MARK in posixpath.basename(p)])
        if not kept:
            body = {"fingerprint": fingerprint, "options": options}
            write_atomic(self.fs, build_file, json.dumps(body, indent=1).encode())
        return kept

    def _load_records(self, fingerprint: str) -> dict[int, Any]:
        out: dict[int, Any] = {}
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(join(self.root, BUILD_DIR), detail=False)
        except FileNotFoundError:
            return out
        for path in sorted(entries):
            m = _RECORD.match(posixpath.basename(path))
            if not m:
                continue
            try:
                rec = json.loads(self.fs.cat_file(path))
            except (OSError, ValueError):
                continue
            if rec.get("fingerprint") != fingerprint or not self._shards_present(rec):
                log.warning("block record %s is stale or its shards are missing: redoing it", path)
                continue
            out[int(m.group(1))] = rec
        return out

    def _shards_present(self, rec: dict[str, Any]) -> bool:
        for shards in rec.get("splits", {}).values():
            for s in shards:
                try:
                    if self.fs.size(join(self.root, s["path"])) != s["num_bytes"]:
                        return False
                    if not self.fs.exists(join(self.root, s["idx_path"])):
                        return False
                except (FileNotFoundError, KeyError):
                    return False
        return True

    def record_keys(self, block: int) -> dict[str, list[str]]:
        """The keys a finished block's record lists per split (to name a duplicate)."""
        rec = json.loads(self.fs.cat_file(join(self.root, BUILD_DIR, f"block-{block:05d}.json")))
        return rec.get("keys", {})

    # -- end -------------------------------------------------------------------------------------
    def finalize(self, manifest: Manifest) -> None:
        """Remove stray shards the manifest does not list, write it (last), drop ``_build/``."""
        listed = {
            join(self.root, p)
            for split in manifest.splits.values()
            for s in split.shards
            for p in (s.path, s.idx_path)
        }
        stray = [p for p in self._our_files() if p not in listed]
        if stray:
            log.info("removing %d stray shard files", len(stray))
            self._rm(stray)
        manifest.save(self.url, self.storage_options)
        self._rm_build_dir()

    def discard(self) -> None:
        """After a user error: remove everything this unfinished build wrote."""
        self._rm(self._our_files())
        self._rm_build_dir()
        self._prune_dirs()
