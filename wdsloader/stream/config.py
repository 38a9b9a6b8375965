"""``create_loader``'s options resolved into one frozen :class:`LoaderConfig` against the manifest.

Pure functions (no I/O): split defaults (``drop_last`` and ``shuffle`` on for ``train`` only),
the curriculum and collator defaults stored in the manifest, span and shuffle-window sizes from
the average sample size, and the read options merged one way. An option given explicitly that
would end up unused is a ValueError naming it (see :func:`resolve_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wdsloader import plan
from wdsloader.format import Manifest
from wdsloader.io.fetch import ReadOptions

if TYPE_CHECKING:
    from wdsloader.curriculum.curriculum import Curriculum
    from wdsloader.mix.spec import MixSpec

# Defaults that trade shuffle quality against read sizes (docs/loading.md: how samples are planned).
SPAN_BYTES = 256 * 2**10  # bytes of consecutive samples kept together (one range read)
WINDOW_BYTES = 64 * 2**20  # raw bytes a worker shuffles within (and holds in memory)
MAX_WINDOW = 16384
MIN_SPANS = 4096
# Remote reads (object stores, HTTP) pay a round trip per range: fewer, larger spans.
REMOTE_SPAN_BYTES = 2 * 2**20
REMOTE_MIN_SPANS = 256

CollateSpec = str | Callable[[list[dict[str, Any]]], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderConfig:
    """Everything a loader is built from, with every default resolved.

    ``fields`` are the decoded stored fields (None: all the samples hold); ``collate`` is a
    registered collator's name (made with ``collate_options``) or a callable;
    ``loader_kwargs`` go to torch's DataLoader; ``mix`` is the sample-level mix when the loader
    reads several sources (``plan`` is then over their shards concatenated in source order).
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


def resolve_read_options(
    read_options: ReadOptions | None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit_bytes: int | None = None,
    verify_checksum: bool | None = None,
) -> ReadOptions:
    """``read_options`` (default: :class:`ReadOptions()`) with each argument that is not None
    set on its field of the same name.

    An argument that contradicts a field ``read_options`` already sets to something other than
    its default is a ValueError naming both; ``cache_limit_bytes`` without a cache directory is
    a ValueError (it would be unused).
    """
    base = read_options if read_options is not None else ReadOptions()
    defaults = ReadOptions()
    given: dict[str, Any] = {
        "storage_options": storage_options,
        "cache_dir": cache_dir,
        "cache_limit_bytes": cache_limit_bytes,
        "verify_checksum": verify_checksum,
    }
    changes: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        current = getattr(base, name)
        if current != getattr(defaults, name) and current != value:
            raise ValueError(
                f"{name}={value!r} conflicts with read_options.{name}={current!r}; "
                f"give it in one place"
            )
        changes[name] = value
    options = dataclasses.replace(base, **changes)
    if options.cache_limit_bytes is not None and options.cache_dir is None:
        raise ValueError(
            f"cache_limit_bytes={options.cache_limit_bytes} needs a cache_dir (it limits the cache)"
        )
    return options


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


def _loader_kwargs(
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int | None,
    multiprocessing_context: Any,
) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": bool(pin_memory and torch.cuda.is_available()),
    }
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        kwargs["prefetch_factor"] = prefetch_factor or 2
        kwargs["multiprocessing_context"] = multiprocessing_context
        return kwargs
    if persistent_workers or prefetch_factor:
        raise ValueError("persistent_workers and prefetch_factor need num_workers > 0")
    if multiprocessing_context is not None:
        raise ValueError(
            f"multiprocessing_context={multiprocessing_context!r} needs num_workers > 0 "
            f"(with num_workers=0 batches are made in the main process)"
        )
    return kwargs


def resolve_config(
    manifest: Manifest,
    split: str,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    remote: bool = False,
    num_workers: int = 0,
    epoch: int = 0,
    drop_last: bool | None = None,
    pin_memory: bool = True,
    seed: int = 0,
    shuffle: bool | None = None,
    shuffle_window: int | None = None,
    span: int | None = None,
    fields: Sequence[str] | None = None,
    collate_fn: CollateSpec | None = None,
    collate_options: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    on_error: str = "raise",
    max_skipped: int | None = None,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    curriculum: Curriculum | Mapping[str, Any] | bool | None = None,
    gather: bool = True,
    mix: MixSpec | None = None,
) -> LoaderConfig:
    """The :class:`LoaderConfig` of :func:`~wdsloader.create_loader`'s options for ``split``
    of ``manifest`` (``remote``: read without a local copy; larger spans by default).

    ValueError for an explicit option that would be unused: a curriculum whose output is not in
    ``fields``, ``persistent_workers``/``prefetch_factor``/``multiprocessing_context`` with
    ``num_workers=0``, ``max_skipped`` with ``on_error="raise"``, ``collate_options`` with a
    callable ``collate_fn``. ``mix`` (with ``manifest`` the sources' merged manifest) is kept
    as given.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if max_skipped is not None and on_error == "raise":
        raise ValueError(f"max_skipped={max_skipped!r} needs on_error='skip' (nothing is skipped)")
    info = manifest.split(split)
    auto_span, auto_window = default_span_window(
        info.num_samples, info.num_bytes, batch_size, remote=remote
    )
    window = shuffle_window if shuffle_window is not None else auto_window
    is_train = split == "train"
    plan_config = plan.PlanConfig(
        counts=tuple(s.num_samples for s in info.shards),
        batch_size=batch_size,
        world_size=world_size,
        num_workers=max(1, num_workers),
        seed=seed,
        shuffle=is_train if shuffle is None else shuffle,
        drop_last=is_train if drop_last is None else drop_last,
        span=span if span is not None else auto_span,
        window=window,
    )
    plain, curr = resolve_fields(fields, curriculum, manifest)
    collate = collate_fn if collate_fn is not None else manifest.loader_defaults.get("collate")
    if collate_options and callable(collate):
        raise ValueError(
            f"collate_options={sorted(collate_options)} would be unused: collate_fn is a "
            "callable (they configure a registered collator given by name)"
        )
    return LoaderConfig(
        split=split,
        rank=rank,
        plan=plan_config,
        epoch=epoch,
        fields=plain,
        curriculum=curr,
        collate=collate if collate is not None else "default",
        collate_options=dict(collate_options or {}),
        allow_pickle=allow_pickle,
        on_error=on_error,
        max_skipped=max_skipped,
        gather=gather,
        readahead_batches=max(1, window // batch_size),
        loader_kwargs=_loader_kwargs(
            num_workers, pin_memory, persistent_workers, prefetch_factor, multiprocessing_context
        ),
        mix=mix,
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
