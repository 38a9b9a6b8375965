"""``manifest.json``: the dataset's schema, splits, shards and build parameters (versioned)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from wdsloader.errors import ManifestError
from wdsloader.storage import join, url_to_fs, write_atomic

FORMAT_NAME = "wdsloader"
FORMAT_VERSION = "1.0"
MANIFEST_NAME = "manifest.json"

Dim = int | str


@dataclass(slots=True, kw_only=True)
class FieldSpec:
    """One field of a sample.

    ``ext`` is the member extension in the tar (``question_emb.npy``); ``encoding`` its last part
    (``npy``, ``json``, ``txt``, ``cls``, ``jpg`` ...), which picks the decoder. ``dtype`` and
    ``shape`` describe arrays (shape dims are ints or symbolic names bound in ``Manifest.dims``);
    for other encodings ``dtype`` names the Python type (``str``, ``int``, ``json``, ``bytes``).
    ``range`` is an optional inclusive ``[low, high]`` for values.
    """

    ext: str
    encoding: str
    dtype: str | None = None
    shape: list[Dim] | None = None
    range: list[float] | None = None

    @property
    def fixed_size(self) -> bool:
        """True when every sample stores this field in the same number of bytes."""
        return self.encoding == "npy" and self.shape is not None and self.dtype is not None


@dataclass(slots=True, kw_only=True)
class ShardInfo:
    """One shard: paths relative to the dataset root, counts, size and checksum.

    ``layout`` maps member extensions whose data has the same offset from the sample's first
    header and the same size in every sample of the shard to ``[offset, size]``: a reader can
    gather such a field for many samples with array indexing instead of parsing headers.
    """

    path: str
    idx_path: str
    num_samples: int
    num_bytes: int
    sha256: str | None = None
    layout: dict[str, list[int]] | None = None


@dataclass(slots=True, kw_only=True)
class SplitInfo:
    """The shards of one split, in order."""

    shards: list[ShardInfo] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)


@dataclass(slots=True, kw_only=True)
class Manifest:
    """The whole dataset description. ``manifest.json`` is written last: its presence means the
    dataset is complete."""

    schema: dict[str, FieldSpec] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    loader_defaults: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    version: str = FORMAT_VERSION

    # -- derived -------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.splits.values())

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.splits.values())

    def split(self, name: str) -> SplitInfo:
        """The named split, or a ManifestError listing the splits there are."""
        try:
            return self.splits[name]
        except KeyError:
            raise ManifestError(
                f"split {name!r} not in the manifest; splits: {sorted(self.splits)}"
            ) from None

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "version": self.version,
            "schema": {k: _drop_none(asdict(v)) for k, v in self.schema.items()},
            "dims": dict(self.dims),
            "splits": {},
            "totals": {"num_samples": self.num_samples, "num_bytes": self.num_bytes},
            "build": self.build,
            "loader_defaults": self.loader_defaults,
        }
        for name, split in self.splits.items():
            out["splits"][name] = {
                "num_samples": split.num_samples,
                "num_bytes": split.num_bytes,
                "shards": [_drop_none(asdict(s)) for s in split.shards],
            }
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = MANIFEST_NAME) -> Manifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ManifestError(f"{source}: not a {FORMAT_NAME} manifest (format field)")
        version = str(data.get("version", ""))
        check_version(version, source=source)
        try:
            schema = {k: FieldSpec(**v) for k, v in data.get("schema", {}).items()}
            splits = {
                name: SplitInfo(shards=[ShardInfo(**s) for s in split["shards"]])
                for name, split in data.get("splits", {}).items()
            }
        except (TypeError, KeyError) as exc:
            raise ManifestError(f"{source}: invalid manifest: {exc}") from None
        manifest = cls(
            schema=schema,
            dims={k: int(v) for k, v in data.get("dims", {}).items()},
            splits=splits,
            build=data.get("build", {}),
            loader_defaults=data.get("loader_defaults", {}),
            version=version,
        )
        manifest.check_paths(source=source)
        return manifest

    def check_paths(self, *, source: str = MANIFEST_NAME) -> None:
        """Raise ManifestError if a shard path is absolute, a URL or leaves the dataset root."""
        for split in self.splits.values():
            for shard in split.shards:
                for p in (shard.path, shard.idx_path):
                    if p.startswith("/") or "://" in p or ".." in p.split("/"):
                        raise ManifestError(f"{source}: shard path {p!r} must be relative")

    # -- I/O -----------------------------------------------------------------------------------
    def save(
        self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> str:
        """Write ``manifest.json`` atomically under ``root``; returns its path."""
        self.check_paths()
        fs, path = url_to_fs(root, storage_options)
        target = join(path, MANIFEST_NAME)
        write_atomic(fs, target, self.to_json().encode())
        return target

    @classmethod
    def load(
        cls, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> Manifest:
        """Read ``manifest.json`` under ``root`` (a folder or URL), with clear errors."""
        fs, path = url_to_fs(root, storage_options)
        target = join(path, MANIFEST_NAME)
        where = f"{os.fspath(root).rstrip('/')}/{MANIFEST_NAME}"
        try:
            raw = fs.cat_file(target)
        except FileNotFoundError:
            raise ManifestError(
                f"{where}: manifest not found (is this a wdsloader dataset, and did its build "
                "finish? `build-shards adopt` makes one for existing shards)"
            ) from None
        except OSError as exc:
            raise ManifestError(f"{where}: manifest unreadable: {exc}") from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where}: manifest is not valid JSON: {exc}") from None
        return cls.from_dict(data, source=where)


def check_version(version: str, *, source: str = MANIFEST_NAME) -> None:
    """Refuse a manifest whose major format version is newer than this library's."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise ManifestError(f"{source}: invalid format version {version!r}") from None
    ours = int(FORMAT_VERSION.split(".")[0])
    if major > ours:
        raise ManifestError(
            f"{source}: format version {version} is newer than this wdsloader supports "
            f"({FORMAT_VERSION}); upgrade wdsloader to read it"
        )


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
