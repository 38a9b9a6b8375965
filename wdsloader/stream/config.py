"""``create_loader``'s options resolved into one frozen :class:`LoaderConfig` against the manifest.

Pure functions (no I/O): split defaults (``drop_last`` and ``shuffle`` on for ``train`` only),
the curriculum and collator defaults stored in the manifest, and span and shuffle-window sizes
from the average sample size. The options (:class:`~wdsloader.stream.loader_options.LoaderOptions`)
check themselves when made; a curriculum given explicitly whose output is not decoded is a
ValueError here (it needs the manifest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wdsloader import plan
from wdsloader.format import Manifest

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum
    from wdsloader.mix.spec import MixSpec
    from wdsloader.plan.pack_plan import PackPlanner
    from wdsloader.stream.loader_options import LoaderOptions

# Defaults that trade shuffle quality against read sizes (docs/loading.md: how samples are planned).
SPAN_BYTES = 256 * 2**10  # bytes of consecutive samples kept together (one range read)
WINDOW_BYTES = 64 * 2**20  # raw bytes a worker shuffles within (and holds in memory)
MAX_WINDOW = 16384
MIN_SPANS = 4096
# Remote reads (object stores, HTTP) pay a round trip per range: fewer, larger spans (a loaded
# state's span is taken by a loader whose span is derived, so this may change: docs/speed.md).
REMOTE_SPAN_BYTES = 8 * 2**20
REMOTE_MIN_SPANS = 256

CollateSpec = str | Callable[[list[dict[str, Any]]], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderConfig:
    """Everything a loader is built from, with every default resolved.

    ``fields`` are the decoded stored fields (None: all the samples hold); ``collate`` is a
    registered collator's name (made with ``collate_options``) or a callable;
    ``loader_kwargs`` go to torch's DataLoader; ``mix`` is the sample-level mix when the loader
    reads several sources (``plan`` is then over their shards concatenated in source order);
    ``packing`` plans packed rows instead of samples (``create_loader(packing=...)``);
    ``worker_mode`` is ``"thread"`` when its workers are threads of the loader's process;
    ``raw_bytes`` and ``images``: :attr:`DecodeOptions.raw_bytes` and ``.images``;
    ``span_derived``: the plan's span was derived (not given), so a loaded state's span
    replaces it (the state's run continues).
    """

    split: str
    rank: int
    plan: plan.PlanConfig
    epoch: int
    fields: tuple[str, ...] | None
    curriculum: Curriculum | None
    collate: CollateSpec
    collate_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    allow_pickle: bool
    on_error: str
    max_skipped: int | None
    gather: bool
    readahead_batches: int
    loader_kwargs: Mapping[str, Any]
    mix: MixSpec | None = None
    packing: PackPlanner | None = None
    worker_mode: str = "process"
    raw_bytes: str = "uint8"
    images: str = "decoded"
    span_derived: bool = False


def default_span_window(
    num_samples: int, num_bytes: int, batch_size: int, *, remote: bool = False
) -> tuple[int, int]:
    """The ``span`` and ``shuffle_window`` (a whole number of batches) used when not given.

    A span holds about ``SPAN_BYTES`` of samples, but the split keeps at least ``MIN_SPANS``
    spans when it can (the rank correlation between source and stream order shrinks like one
    over the square root of the number of spans); a window holds about ``WINDOW_BYTES``. Read
    remotely (no local cache), a span holds about ``REMOTE_SPAN_BYTES`` and at least
    ``REMOTE_MIN_SPANS`` spans are kept: each range read costs a round trip.
    """
    avg = max(1, num_bytes // max(1, num_samples))
    if remote:
        span_bytes, min_spans = REMOTE_SPAN_BYTES, REMOTE_MIN_SPANS
    else:
        span_bytes, min_spans = SPAN_BYTES, MIN_SPANS
    span = max(1, min(4096, round(span_bytes / avg), num_samples // min_spans))
    window = max(batch_size, min(MAX_WINDOW, WINDOW_BYTES // avg))
    return span, -(-window // batch_size) * batch_size


def resolve_curriculum(
    curriculum: Curriculum | Mapping[str, Any] | bool | None, manifest: Manifest
) -> Curriculum | None:
    """The curriculum in force: the argument, else the manifest's default."""
    from wdsloader.curriculum.curriculum import Curriculum

    if curriculum is False:
        return None
    if curriculum is None or curriculum is True:
        stored = manifest.loader_defaults.get("curriculum")
        if stored is None:
            if curriculum is True:
                raise ValueError("curriculum=True but the manifest stores no curriculum")
            return None
        return Curriculum.from_dict(stored)
    if isinstance(curriculum, Curriculum):
        return curriculum
    if isinstance(curriculum, Mapping):
        return Curriculum.from_dict(curriculum)
    raise TypeError(f"curriculum must be a Curriculum, a dict, a bool or None, got {curriculum!r}")


def resolve_fields(
    fields: Sequence[str] | None,
    curriculum: Curriculum | Mapping[str, Any] | bool | None,
    manifest: Manifest,
) -> tuple[tuple[str, ...] | None, Curriculum | None]:
    """The stored fields to decode and the curriculum in force.

    Without ``fields``: every schema field that is not a curriculum variant. With ``fields``: a
    curriculum applies when its output is among them (its outputs are then not stored fields);
    the manifest's default curriculum is left out otherwise, an explicit one is a ValueError.
    """
    if isinstance(fields, str):
        raise TypeError(f"fields must be a sequence of field names, not the string {fields!r}")
    curr = resolve_curriculum(curriculum, manifest)
    plain = None if fields is None else list(fields)
    if curr is None:
        return (None if plain is None else tuple(plain)), None
    outputs = {curr.output, curr.index_output} - {None}
    if plain is None:
        return tuple(f for f in manifest.schema if f not in curr.fields), curr
    if curr.output in plain:
        return tuple(f for f in plain if f not in outputs), curr
    if curriculum is not None:  # given explicitly: dropping it would be silent
        raise ValueError(
            f"curriculum output {curr.output!r} is not in fields={plain}; add it to fields, "
            f"or pass curriculum=False"
        )
    return tuple(plain), None


def resolve_config(
    manifest: Manifest,
    options: LoaderOptions,
    *,
    rank: int = 0,
    world_size: int = 1,
    remote: bool = False,
    mix: MixSpec | None = None,
) -> LoaderConfig:
    """The :class:`LoaderConfig` of ``options`` for their split of ``manifest``, read as
    ``rank`` of ``world_size`` (``remote``: read without a local copy; larger spans by
    default). ``mix`` (with ``manifest`` the sources' merged manifest) is kept as given.

    A ValueError for a curriculum given explicitly whose output is not in the decoded fields
    (see :func:`resolve_fields`); the options checked themselves when made.
    """
    split, batch_size = options.split, options.batch_size
    info = manifest.split(split)
    auto_span, auto_window = default_span_window(
        info.num_samples, info.num_bytes, batch_size, remote=remote
    )
    span, window = options.plan.span, options.plan.shuffle_window
    window = window if window is not None else auto_window
    is_train = split == "train"
    plan_config = plan.PlanConfig(
        counts=tuple(s.num_samples for s in info.shards),
        batch_size=batch_size,
        world_size=world_size,
        num_workers=max(1, options.num_workers),
        seed=options.seed,
        shuffle=is_train if options.shuffle is None else options.shuffle,
        drop_last=is_train if options.drop_last is None else options.drop_last,
        span=span if span is not None else auto_span,
        window=window,
    )
    decode = options.decode
    plain, curr = resolve_fields(decode.fields, decode.curriculum, manifest)
    collate = options.collate_fn
    collate = collate if collate is not None else manifest.loader_defaults.get("collate")
    return LoaderConfig(
        split=split,
        rank=rank,
        plan=plan_config,
        epoch=options.epoch,
        fields=plain,
        curriculum=curr,
        collate=collate if collate is not None else "default",
        collate_options=dict(decode.collate_options or {}),
        allow_pickle=decode.allow_pickle,
        on_error=options.errors.on_error,
        max_skipped=options.errors.max_skipped,
        gather=decode.gather,
        readahead_batches=max(1, window // batch_size),
        loader_kwargs=options.workers.loader_kwargs(options.num_workers, options.pin_memory),
        mix=mix,
        worker_mode=options.workers.mode if options.num_workers > 0 else "process",
        raw_bytes=decode.raw_bytes,
        images=decode.images,
        span_derived=span is None,
    )


def make_collate(
    config: LoaderConfig, optional: Sequence[str] = ()
) -> Callable[[list[dict[str, Any]]], Any]:
    """The collate function of ``config``: its callable, or the registered collator it names
    made with its ``collate_options`` (a ValueError listing the registered ones when unknown).
    ``optional``: the schema's optional fields, passed as ``optional=`` to a registered collator
    whose factory takes that keyword (the built-ins do: they yield those fields as lists in
    every batch, so a field's type is the same whether or not a batch lacks it)."""
    if callable(config.collate):
        return config.collate
    from wdsloader.collate.registry import CollatorRegistry

    options = dict(config.collate_options)
    registry = CollatorRegistry.get_instance()
    if optional and "optional" not in options and registry.accepts(config.collate, "optional"):
        options["optional"] = tuple(optional)
    return registry.get_collator(collator_name=config.collate, **options)
