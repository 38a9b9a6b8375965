"""The dataset card ``README.md`` beside ``manifest.json``: a YAML header whose ``configs`` name each
split's shards (the Hugging Face convention), so that ``datasets.load_dataset(DIR)`` reads a
dataset we built or adopted with the splits the manifest has, streaming or not.

A ``README.md`` we did not write (no :data:`CARD_MARK` in it) is never replaced: the card is then
skipped with a warning that shows the header to add.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from wdsloader.format import Manifest, ShardInfo
from wdsloader.format.lengths import LENGTHS_FIELD
from wdsloader.io.storage import join, write_atomic

log = logging.getLogger("build_shards")

CARD_NAME = "README.md"
CARD_MARK = (
    "<!-- dataset card written by wdsloader: build-shards rewrites it (build, adopt); "
    "delete this line to keep your edits -->"
)
_HF_SPLIT = re.compile(r"^\w+(\.\w+)*$")  # the split names `datasets` accepts
_GLOB_CHARS = frozenset("*?[]{}")
_MAX_SHOWN = 2000  # characters of the header a warning shows
_MAX_NAMES = 3  # names of one kind of side file the card shows (then "...")
# what the card says of each side file a shard may list (a ShardInfo field ``*_path``)
_SIDE_FILES = {
    "idx_path": "the index of each sample's offset in the shard",
    "keys_path": "the key index, each sample found by its key",
    "lengths_path": "the length of {field}each sample",
}


def data_files(
    manifest: Manifest, listing: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """Per split with shards, the ``data_files`` patterns of its shards: ``DIR/*.tar``
    (``*.tar.gz``) for a folder whose tar files all belong to the split, else the shards' paths.

    ``listing`` maps every tar file in the dataset's folders (relative path) to its split
    (adopt); without it, a folder is taken to hold only the manifest's shards (a build).
    """
    owners: dict[str, set[str]] = {}
    for rel, split in (listing or {}).items():
        owners.setdefault(posixpath.dirname(rel), set()).add(split)
    for split, info in manifest.splits.items():
        for s in info.shards:
            owners.setdefault(posixpath.dirname(s.path), set()).add(split)
    out: dict[str, list[str]] = {}
    for split, info in manifest.splits.items():
        if not info.shards:  # no files: `datasets` refuses an entry without a path
            continue
        folders: dict[str, list[ShardInfo]] = {}
        for s in info.shards:
            folders.setdefault(posixpath.dirname(s.path), []).append(s)
        patterns: list[str] = []
        for folder, shards in folders.items():
            suffixes = {".tar.gz" if s.compression else ".tar" for s in shards}
            if owners[folder] == {split} and len(suffixes) == 1 and not _GLOB_CHARS & set(folder):
                patterns.append(posixpath.join(folder, "*" + suffixes.pop()))
            else:
                patterns.extend(s.path for s in shards)
        out[split] = patterns
    return out


def card_header(files: Mapping[str, list[str]]) -> str:
    """The YAML header of the card: one ``default`` config with a ``data_files`` entry per split
    (a split name ``datasets`` refuses has its other characters replaced by ``_``; names are
    quoted, so that ``1``, ``null`` or ``yes`` stay strings)."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split, name in _hf_names(list(files)).items():
        lines += [f"  - split: {json.dumps(name)}", "    path:"]
        lines += [f"    - {json.dumps(p)}" for p in files[split]]
    return "\n".join([*lines, "---", ""])


def card_text(manifest: Manifest, files: Mapping[str, list[str]]) -> str:
    """The whole card: the header, then what the dataset holds."""
    return "\n".join([card_header(files), CARD_MARK, card_body(manifest)])


def card_body(manifest: Manifest) -> str:
    """What the dataset holds (the card after its header and :data:`CARD_MARK`): its files, side
    files, splits and fields."""
    rows = [
        f"| {split} | {info.num_samples} | {len(info.shards)} |"
        for split, info in manifest.splits.items()
    ]
    fields = ", ".join(f"`{name}` (`{spec.ext}`)" for name, spec in manifest.schema.items())
    return "\n".join(
        [
            "",
            "WebDataset tar shards with a `manifest.json` (the schema, each shard's sample count,",
            "size and checksum) and, beside the shards, the side files it lists for `wdsloader`",
            "(`X.tar` stands for the shard's file name):",
            "",
            *(side_file_lines(manifest) or ["- (none)"]),
            "",
            "Any WebDataset reader reads the shards; `datasets.load_dataset` reads this folder.",
            "",
            "| split | samples | shards |",
            "| --- | --- | --- |",
            *rows,
            "",
            f"Fields: {fields or '(none recorded)'}.",
            "",
        ]
    )


def side_file_lines(manifest: Manifest) -> list[str]:
    """One line per kind of side file the manifest's shards list (each ``ShardInfo`` field
    ``*_path`` but the shard's own): its names as the manifest has them (the shard's name
    replaced by ``X.tar``), what it holds and how many shards have one; none for a kind no
    shard has."""
    shards = [s for info in manifest.splits.values() for s in info.shards]
    field = manifest.build.get(LENGTHS_FIELD)
    lines = []
    for kind in (f.name for f in dataclasses.fields(ShardInfo)):
        if not kind.endswith("_path") or kind == "path":
            continue
        named = [(s.path, getattr(s, kind)) for s in shards if getattr(s, kind)]
        if not named:
            continue
        names = sorted({_generic_name(shard, side) for shard, side in named})
        shown = ", ".join(f"`{n}`" for n in names[:_MAX_NAMES])
        shown += ", ..." if len(names) > _MAX_NAMES else ""
        what = _SIDE_FILES.get(kind, f"`{kind}`").format(field=f"`{field}` in " if field else "")
        count = (
            "every shard" if len(named) == len(shards) else f"{len(named)} of {len(shards)} shards"
        )
        lines.append(f"- {shown}: {what} ({count})")
    return lines


def _generic_name(shard: str, side: str) -> str:
    """The name of a shard's side file with the shard's name as ``X.tar`` (``X.tar.gz``):
    ``train/.train-00000-000.tar.wdsidx`` -> ``.X.tar.wdsidx``; a side file that does not carry
    its shard's name keeps its path."""
    base = posixpath.basename(shard)
    suffix = ".tar.gz" if base.endswith(".tar.gz") else ".tar"
    name = posixpath.basename(side)
    return name.replace(base, "X" + suffix) if base in name else side


def write_card(
    fs: Any,
    root: str,
    display: str,
    manifest: Manifest,
    listing: Mapping[str, str] | None = None,
) -> bool:
    """Write the card under ``root`` unless a ``README.md`` not written by us is there (then a
    warning shows the header to add); whether it was written."""
    files = data_files(manifest, listing)
    path = join(root, CARD_NAME)
    fs.invalidate_cache()
    if fs.exists(path) and CARD_MARK.encode() not in fs.cat_file(path):
        header = card_header(files)
        shown = header if len(header) <= _MAX_SHOWN else header[:_MAX_SHOWN] + "...\n"
        log.warning(
            "%s/%s exists and was not written by wdsloader: left as it is, without a dataset "
            "card; for `datasets.load_dataset` to read the splits, put this header at its top:\n%s",
            display,
            CARD_NAME,
            shown,
        )
        return False
    write_atomic(fs, path, card_text(manifest, files).encode())
    return True


def refresh_card(fs: Any, root: str, manifest: Manifest) -> bool:
    """Rewrite what the card under ``root`` says of the dataset (:func:`card_body`) after its
    manifest changed, its header (each split's ``data_files``) kept; a card we did not write, or
    none, is left alone. Whether it was rewritten."""
    path = join(root, CARD_NAME)
    fs.invalidate_cache()
    if not fs.exists(path):
        return False
    text = fs.cat_file(path).decode()
    at = text.find(CARD_MARK)
    if at < 0:
        return False
    write_atomic(fs, path, (text[: at + len(CARD_MARK)] + "\n" + card_body(manifest)).encode())
    return True


def _hf_names(splits: list[str]) -> dict[str, str]:
    """Our split -> its name in the card; a split whose replaced name another split has is left
    out with a warning."""
    out: dict[str, str] = {}
    taken = {s for s in splits if _HF_SPLIT.match(s)}
    for split in splits:
        name = split if _HF_SPLIT.match(split) else re.sub(r"\W", "_", split)
        if name != split and name in taken:
            log.warning(
                "split %r is left out of the dataset card: `datasets` refuses its name and "
                "%r is taken",
                split,
                name,
            )
            continue
        taken.add(name)
        out[split] = name
    return out
