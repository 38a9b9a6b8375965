"""``manifest.json``: the dataset's schema, splits, shards and build parameters (versioned)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from wdsloader import seams
from wdsloader.errors import ManifestError
from wdsloader.format.checks import (
    MAX_INT,
    InvalidField,
    check_array_dtype,
    check_count,
    check_depth,
    check_grouped,
    check_keys,
    check_layout,
    check_list,
    check_obj,
    check_optional,
    check_range,
    check_sha256,
    check_shape,
    check_str,
    check_total,
    path_problem,
)
from wdsloader.format.codecs import is_fixed_width
from wdsloader.format.deflate import COMPRESSIONS
from wdsloader.format.toplevel import check_top_level
from wdsloader.format.version import (
    EXTENDED_VERSION,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SIDE_FILES_MINOR,
    _major,
    _minor,
    check_version,
    newer_hint,
)

FORMAT_NAME = "wdsloader"

Dim = int | str


@dataclass(slots=True, kw_only=True)
class FieldSpec:
    """One field of a sample.

    ``ext`` is the member extension in the tar (``question_emb.npy``); ``encoding`` its last part
    (``npy``, ``json``, ``txt``, ``cls``, ``jpg`` ...), which picks the decoder. ``dtype`` and
    ``shape`` describe arrays (shape dims are ints or symbolic names bound in ``Manifest.dims``);
    for other encodings ``dtype`` names the Python type (``str``, ``int``, ``json``, ``bytes``).
    ``range`` is an optional inclusive ``[low, high]`` for values.

    ``grouped``: the value is not a member of its own but the entry named after the field in
    the JSON object of member ``ext`` (``fields.json``), shared with the sample's other small
    fields; it reads back as a member of ``encoding`` would (see
    :mod:`wdsloader.format.groups`).

    ``optional``: samples may lack the field (their tar holds no such member, or their grouped
    object no such entry: the WebDataset convention); the loader yields None for it.
    """

    ext: str
    encoding: str
    dtype: str | None = None
    shape: list[Dim] | None = None
    range: list[float] | None = None
    grouped: bool | None = None
    optional: bool | None = None

    def __post_init__(self) -> None:
        try:
            _check_spec_values(self.ext, self.encoding, self.dtype, self.shape, self.range, "")
            check_grouped(self.grouped, self.ext, self.encoding, "")
            check_optional(self.optional, "")
        except InvalidField as exc:
            raise ManifestError(f"FieldSpec(ext={self.ext!r}){exc}") from None
        if isinstance(self.shape, tuple):
            self.shape = list(self.shape)
        if isinstance(self.range, tuple):
            self.range = list(self.range)

    @property
    def fixed_size(self) -> bool:
        """True when every sample stores this field in the same number of bytes: a fixed-width
        codec's field (``npy``) with a declared dtype and shape."""
        return (
            is_fixed_width(self.encoding)
            and self.shape is not None
            and self.dtype is not None
            and not self.optional
        )


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
    compression: str | None = None
    """None (a plain tar) or ``"gzip"`` (see :mod:`wdsloader.format.deflate`): the index then
    holds compressed offsets and ``num_bytes``/``sha256`` are the compressed file's."""
    keys_path: str | None = None
    """The shard's key index (:mod:`wdsloader.format.keyindex`), when it has one: a sample is
    found by key without reading the shard."""
    lengths_path: str | None = None
    """Its samples' lengths of the declared field (:mod:`wdsloader.format.lengths`), when the
    build recorded them."""
    lengths_sha256: str | None = None
    """The sha256 of the lengths file (checked when it is read)."""


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

    def __repr__(self) -> str:
        """Short: format, samples and shards per split, fields, dims (``to_json()``: all)."""
        splits = {
            name: f"{split.num_samples:,} samples in {len(split.shards):,} shards"
            for name, split in self.splits.items()
        }
        return (
            f"Manifest(format='{self.format} {self.written_version()}', splits={splits}, "
            f"fields={list(self.schema)}, dims={self.dims})"
        )

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
    def uses_extensions(self) -> bool:
        """Whether a wdsloader older than :data:`EXTENDED_VERSION` would misread this dataset
        (a compressed shard, a grouped or optional field)."""
        return any(spec.grouped or spec.optional for spec in self.schema.values()) or any(
            shard.compression is not None
            for split in self.splits.values()
            for shard in split.shards
        )

    def written_version(self) -> str:
        """The version :meth:`to_dict` writes: ``version``, raised to :data:`EXTENDED_VERSION`
        when the dataset needs it and to its minor :data:`SIDE_FILES_MINOR` with side files."""
        version = self.version
        if self.uses_extensions() and _major(version) < _major(EXTENDED_VERSION):
            version = EXTENDED_VERSION
        side = any(s.keys_path or s.lengths_path for sp in self.splits.values() for s in sp.shards)
        if side and _minor(version) < SIDE_FILES_MINOR:
            version = f"{_major(version)}.{SIDE_FILES_MINOR}"
        return version

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "version": self.written_version(),
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
        """The manifest ``data`` (parsed JSON) describes. Every value is checked: a missing key,
        a wrong type, a negative size, an unsafe shard path... is a :class:`ManifestError`
        naming ``source`` and the field (``splits.train.shards[3].num_samples``)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ManifestError(f"{source}: not a {FORMAT_NAME} manifest (format field)")
        try:
            version = check_str(data.get("version"), "version")
        except InvalidField as exc:
            raise ManifestError(f"{source}: {exc}") from None
        check_version(version, source=source)  # type: ignore[arg-type]
        check_top_level(data, source)
        try:
            return cls._parse(data, version)  # type: ignore[arg-type]
        except InvalidField as exc:
            raise ManifestError(f"{source}: {exc}{newer_hint(version)}") from None  # type: ignore[arg-type]

    @classmethod
    def _parse(cls, data: dict[str, Any], version: str) -> Manifest:
        """The checked fields of ``data`` (raises :class:`InvalidField`)."""
        schema = {}
        for name, spec in check_obj(data.get("schema", {}), "schema").items():
            schema[name] = _field_spec(spec, f"schema.{name}")
        dims = {}
        for name, size in check_obj(data.get("dims", {}), "dims").items():
            dims[name] = check_count(size, f"dims.{name}")
        splits = {}
        for name, split in check_obj(data.get("splits", {}), "splits").items():
            where = f"splits.{name}"
            if "shards" not in check_obj(split, where):
                raise InvalidField(f"{where}: missing 'shards'")
            for key in ("num_samples", "num_bytes"):
                if key in split:
                    check_count(split[key], f"{where}.{key}")
            shards = check_list(split["shards"], f"{where}.shards")
            splits[name] = SplitInfo(
                shards=[_shard_info(s, where, i) for i, s in enumerate(shards)]
            )
            for key in ("num_samples", "num_bytes"):  # read as int64 sample ids and offsets
                check_total(getattr(splits[name], key), f"{where}: its shards' {key}")
        build = check_obj(data.get("build", {}), "build")
        check_depth(build, "build")
        defaults = check_obj(data.get("loader_defaults", {}), "loader_defaults")
        check_depth(defaults, "loader_defaults")
        _check_loader_defaults(defaults)
        return cls(
            schema=schema,
            dims=dims,
            splits=splits,
            build=build,
            loader_defaults=defaults,
            version=version,
        )

    def check_paths(self, *, source: str = MANIFEST_NAME) -> None:
        """Raise ManifestError naming the shard or index path that could leave the dataset root.

        Paths are checked as written, before any decoding: see
        :func:`wdsloader.format.checks.path_problem` for what is refused.
        """
        for name, split in self.splits.items():
            for i, shard in enumerate(split.shards):
                for key in ("path", "idx_path", "keys_path", "lengths_path"):
                    value = getattr(shard, key)
                    if value is not None:
                        _check_path(value, f"splits.{name}.shards[{i}].{key}", source)

    # -- I/O (wdsloader.io.manifest_io reads and writes it: this layer imports no storage) ------
    def save(
        self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> str:
        """Write ``manifest.json`` atomically under ``root``; returns its path
        (:func:`wdsloader.io.manifest_io.save_manifest`)."""
        return _storage()[1](self, root, storage_options)

    @classmethod
    def load(
        cls, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> Manifest:
        """Read ``manifest.json`` under ``root`` (a folder or URL), with clear errors
        (:func:`wdsloader.io.manifest_io.load_manifest`)."""
        return _storage()[0](root, storage_options)


LoadManifest = Callable[[str | os.PathLike[str], dict[str, Any] | None], Manifest]
SaveManifest = Callable[[Manifest, str | os.PathLike[str], dict[str, Any] | None], str]
_STORAGE: list[tuple[LoadManifest, SaveManifest]] = []


def plug_storage(load: LoadManifest, save: SaveManifest) -> None:
    """Set what :meth:`Manifest.load` and :meth:`Manifest.save` read and write through (the
    storage layer, :mod:`wdsloader.io.manifest_io`, plugs itself in when imported)."""
    _STORAGE[:] = [(load, save)]


STORAGE_SEAM = "manifest-storage"  # the package root names its provider (wdsloader.seams)


def _storage() -> tuple[LoadManifest, SaveManifest]:
    if not _STORAGE:
        seams.load_provider(STORAGE_SEAM)  # imports wdsloader.io.manifest_io, which plugs in
    if not _STORAGE:  # not reached: the provider plugs itself in
        raise RuntimeError(
            "Manifest.load/save read and write through wdsloader.io.manifest_io: import it "
            "(or use its load_manifest/save_manifest)"
        )
    return _STORAGE[0]


_SPEC_KEYS = {"ext", "encoding", "dtype", "shape", "range", "grouped", "optional"}
_SHARD_REQUIRED = {"path", "idx_path", "num_samples", "num_bytes"}
_SHARD_KEYS = _SHARD_REQUIRED | {
    "sha256", "layout", "compression", "keys_path", "lengths_path", "lengths_sha256",
}  # fmt: skip


def _check_spec_values(
    ext: Any, encoding: Any, dtype: Any, shape: Any, range_: Any, where: str
) -> None:
    """The types of a field's values (shared by FieldSpec and the manifest reader)."""
    check_str(ext, f"{where}.ext")
    check_str(encoding, f"{where}.encoding")
    check_str(dtype, f"{where}.dtype", optional=True)
    check_shape(shape, f"{where}.shape")
    check_range(range_, f"{where}.range")


def _field_spec(spec: Any, where: str) -> FieldSpec:
    check_keys(check_obj(spec, where), where, {"ext", "encoding"}, _SPEC_KEYS)
    _check_spec_values(
        spec["ext"],
        spec["encoding"],
        spec.get("dtype"),
        spec.get("shape"),
        spec.get("range"),
        where,
    )
    check_grouped(spec.get("grouped"), spec["ext"], spec["encoding"], where)
    check_optional(spec.get("optional"), where)
    if spec["encoding"] == "npy" and spec.get("dtype") is not None:
        check_array_dtype(spec["dtype"], f"{where}.dtype")
    return FieldSpec(**spec)


def _shard_info(shard: Any, split: str, i: int) -> ShardInfo:
    # checked with relative field names, the path put in front only on failure: a manifest can
    # list millions of shards
    try:
        check_keys(check_obj(shard, ""), "", _SHARD_REQUIRED, _SHARD_KEYS)
        for key in ("path", "idx_path", "keys_path", "lengths_path"):
            problem = None if key not in shard else path_problem(shard[key])
            if problem is not None:
                raise InvalidField(_path_message(shard[key], f".{key}", problem))
        n, size = shard["num_samples"], shard["num_bytes"]
        if not (
            type(n) is int and type(size) is int and 0 <= min(n, size) <= max(n, size) <= MAX_INT
        ):
            check_count(n, ".num_samples")
            check_count(size, ".num_bytes")
        check_sha256(shard.get("sha256"), ".sha256")
        check_sha256(shard.get("lengths_sha256"), ".lengths_sha256")
        check_layout(shard.get("layout"), ".layout")
        compression = shard.get("compression")
        if compression is not None and compression not in COMPRESSIONS:
            raise InvalidField(
                f".compression: expected null or one of {list(COMPRESSIONS)}, got {compression!r}"
            )
    except InvalidField as exc:
        raise InvalidField(f"{split}.shards[{i}]{exc}") from None
    return ShardInfo(**shard)


def _check_loader_defaults(defaults: dict[str, Any]) -> None:
    """The types of the loader's defaults; whether the curriculum builds is checked where the
    loader builds it (:func:`wdsloader.curriculum.curriculum.stored_curriculum`)."""
    if "collate" in defaults:
        check_str(defaults["collate"], "loader_defaults.collate", optional=True)
    if defaults.get("curriculum") is not None:
        check_obj(defaults["curriculum"], "loader_defaults.curriculum")


def _path_message(path: Any, where: str, problem: str) -> str:
    return (
        f"{where}: shard path {path!r} refused: {problem} (shard and index paths must be "
        "relative, '/'-separated and inside the dataset root)"
    )


def _check_path(path: Any, where: str, source: str) -> None:
    problem = path_problem(path)
    if problem is not None:
        raise ManifestError(f"{source}: {_path_message(path, where, problem)}")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
