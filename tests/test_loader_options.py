"""create_loader's option objects: each moved keyword warns, naming its replacement, and makes
the same loader as the object; each object refuses what cannot be meant, with the exact message;
a Mix equals the old list plus keywords batch for batch; an unknown keyword is a TypeError."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tests.dataset_factory import write_dataset
from wdsloader import (
    DecodeOptions,
    ErrorPolicy,
    Mix,
    MixSource,
    PlanOptions,
    ReadOptions,
    Topology,
    WorkerOptions,
    create_loader,
)
from wdsloader.curriculum import fixed
from wdsloader.stream.loader_options import DEPRECATED, LoaderOptions, loader_options

COUNTS = [13, 9, 11]  # 33 samples
CACHE = "unused-cache-dir"  # a local root reads no cache: nothing is written there


class FakeMesh:
    """What create_loader reads of a DeviceMesh: rank 1 of a 2 x 2 mesh "dp" x "tp"."""

    mesh_dim_names = ("dp", "tp")

    def get_local_rank(self, dim: str) -> int:
        return {"dp": 1, "tp": 0}[dim]

    def size(self, dim: int) -> int:
        return (2, 2)[dim]


MESH = FakeMesh()

# (the old keywords, the same options as objects, parameters both take, the warnings' text)
CASES = [
    ({"span": 3}, {"plan": PlanOptions(span=3)}, {}, ["plan=PlanOptions(span=...)"]),
    (
        {"shuffle_window": 8},
        {"plan": PlanOptions(shuffle_window=8)},
        {},
        ["plan=PlanOptions(shuffle_window=...)"],
    ),
    (
        {"rank": 1, "world_size": 2},
        {"topology": Topology(rank=1, world_size=2)},
        {},
        ["topology=Topology(rank=...)", "topology=Topology(world_size=...)"],
    ),
    (
        {"device_mesh": MESH, "dp_dim": "dp"},
        {"topology": Topology(device_mesh=MESH, dp_dim="dp")},
        {},
        ["topology=Topology(device_mesh=...)", "topology=Topology(dp_dim=...)"],
    ),
    (
        {"persistent_workers": True, "prefetch_factor": 3, "multiprocessing_context": "fork"},
        {
            "workers": WorkerOptions(
                persistent_workers=True, prefetch_factor=3, multiprocessing_context="fork"
            )
        },
        {"num_workers": 1},
        [
            "workers=WorkerOptions(persistent_workers=...)",
            "workers=WorkerOptions(prefetch_factor=...)",
            "workers=WorkerOptions(multiprocessing_context=...)",
        ],
    ),
    (
        {"cache_dir": CACHE, "cache_limit_bytes": 2**20, "verify_checksum": True},
        {
            "read_options": ReadOptions(
                cache_dir=CACHE, cache_limit_bytes=2**20, verify_checksum=True
            )
        },
        {},
        [
            "read_options=ReadOptions(cache_dir=...)",
            "read_options=ReadOptions(cache_limit_bytes=...)",
            "read_options=ReadOptions(verify_checksum=...)",
        ],
    ),
    (
        {"fields": ["idx", "vec"], "collate_options": {"float64": ["vec"]}, "gather": False},
        {
            "decode": DecodeOptions(
                fields=("idx", "vec"), collate_options={"float64": ["vec"]}, gather=False
            )
        },
        {},
        [
            "decode=DecodeOptions(fields=...)",
            "decode=DecodeOptions(collate_options=...)",
            "decode=DecodeOptions(gather=...)",
        ],
    ),
    (
        {"curriculum": False, "allow_pickle": True},
        {"decode": DecodeOptions(curriculum=False, allow_pickle=True)},
        {},
        ["decode=DecodeOptions(curriculum=...)", "decode=DecodeOptions(allow_pickle=...)"],
    ),
    (
        {"on_error": "skip", "max_skipped": 2, "check_shards": False},
        {"errors": ErrorPolicy(on_error="skip", max_skipped=2, check_shards=False)},
        {},
        [
            "errors=ErrorPolicy(on_error=...)",
            "errors=ErrorPolicy(max_skipped=...)",
            "errors=ErrorPolicy(check_shards=...)",
        ],
    ),
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("options") / "ds"
    write_dataset(str(root), {"train": COUNTS})
    return str(root)


@pytest.fixture(scope="module")
def mixdata(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("options-mix")
    for name, counts in {"a": [20, 10], "b": [15], "c": [8, 8]}.items():
        write_dataset(str(root / name), {"train": counts})
    return root


def summary(loader) -> dict:
    """What makes two loaders the same: their plan, reads, decoding, workers and batches."""
    ds = loader.dataset_obj
    batches = [{k: v.tolist() if torch.is_tensor(v) else v for k, v in b.items()} for b in loader]
    return {
        "len": len(loader),
        "batches": batches,
        "plan": ds.config,
        "rank": ds.rank,
        "fields": ds.fields,
        "errors": (ds.on_error, ds.max_skipped),
        "pickle": ds.decoder.allow_pickle,
        "gathered": ds.columnar is not None,
        "reads": getattr(ds.store, "options", None),  # a mix's store: None
        "workers": (
            loader.num_workers,
            loader.prefetch_factor,
            loader.persistent_workers,
            loader.multiprocessing_context,
        ),
        "fingerprint": loader.fingerprint,
    }


def no_deprecation(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return fn(*args, **kwargs)


@pytest.mark.parametrize(("old", "new", "common", "replacements"), CASES)
def test_a_moved_keyword_warns_and_makes_the_same_loader(ds, old, new, common, replacements):
    with pytest.warns(DeprecationWarning) as record:
        before = create_loader(ds, "train", 4, seed=5, **common, **old)
    expected = [
        f"create_loader({name}=...) is deprecated: pass {repl}; it will be removed in "
        f"wdsloader 0.2.0"
        for name, repl in zip(old, replacements, strict=True)
    ]
    assert [str(w.message) for w in record] == expected
    assert {w.filename for w in record} == {__file__}  # points at the caller
    after = no_deprecation(create_loader, ds, "train", 4, seed=5, **common, **new)
    assert summary(before) == summary(after)
    plain = loader_options(ds, {}, split="train", batch_size=4, **common)[1]
    moved = loader_options(ds, {}, split="train", batch_size=4, **common, **new)[1]
    assert moved != plain  # each case changes something a loader is built from


def test_every_moved_keyword_has_a_case():
    covered = {name for old, *_ in CASES for name in old} | {
        "weights", "epoch_samples", "batching", "source_field"
    }  # fmt: skip
    assert covered == set(DEPRECATED)


def _mix_sources(root: Path) -> list[MixSource]:
    return [MixSource(root / "a"), MixSource(root / "b"), MixSource(root / "c")]


def test_a_mix_object_equals_the_list_and_keywords_batch_for_batch(mixdata):
    weights = fixed({"a": 0.5, "b": 0.3, "c": 0.2})
    kw = {"weights": weights, "epoch_samples": 40, "batching": "stratified", "source_field": "src"}
    with pytest.warns(DeprecationWarning) as record:
        old = create_loader(_mix_sources(mixdata), "train", 4, seed=3, **kw)
    assert [str(w.message) for w in record] == [
        f"create_loader({k}=...) is deprecated: pass source=Mix(sources, {k}=...); it will be "
        f"removed in wdsloader 0.2.0"
        for k in kw
    ]
    new = no_deprecation(create_loader, Mix(_mix_sources(mixdata), **kw), "train", 4, seed=3)
    got = summary(new)
    assert summary(old) == got and got["len"] == 10
    assert {s for b in got["batches"] for s in b["src"]} == {0, 1, 2}
    # a plain list is still short for Mix(list), without a warning
    short = no_deprecation(create_loader, _mix_sources(mixdata), "train", 4, seed=3)
    same = no_deprecation(create_loader, Mix(_mix_sources(mixdata)), "train", 4, seed=3)
    assert summary(short) == summary(same)


def test_a_mix_keyword_contradicting_the_mix_is_an_error(mixdata):
    mix = Mix(_mix_sources(mixdata), batching="stratified")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError) as err:
        create_loader(mix, "train", 4, batching="mixed")
    assert str(err.value) == (
        "batching='mixed' conflicts with source.batching='stratified'; give it in one place"
    )


def test_mix_keywords_with_one_dataset_are_an_error(ds):
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(
            ValueError,
            match=r"^\['batching', 'epoch_samples'\] would be unused: they configure a mix "
            r"\(pass a Mix as the source\)$",
        ),
    ):
        create_loader(ds, "train", 4, epoch_samples=10, batching="mixed")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PlanOptions(span=0), "PlanOptions.span must be an integer >= 1, got 0"),
        (
            lambda: PlanOptions(shuffle_window=2.5),
            "PlanOptions.shuffle_window must be an integer >= 1, got 2.5",
        ),
        (
            lambda: Topology(device_mesh=MESH, rank=0, world_size=2),
            "device_mesh gives the data-parallel rank and size; distributed=True, rank and "
            "world_size would contradict it (give one of them)",
        ),
        (
            lambda: Topology(dp_dim="dp"),
            "dp_dim='dp' would be unused: it names a dimension of device_mesh",
        ),
        (lambda: Topology(rank=0), "give both rank and world_size, or neither"),
        (
            lambda: Topology(rank=2, world_size=2),
            "rank must be an integer in [0, world_size=2), got 2",
        ),
        (
            lambda: Topology(rank=0, world_size=0),
            "world_size must be an integer >= 1, got 0",
        ),
        (
            lambda: WorkerOptions(prefetch_factor=0),
            "prefetch_factor must be an integer >= 1, got 0",
        ),
        (
            lambda: ReadOptions(cache_limit_bytes=10),
            "cache_limit_bytes=10 needs a cache_dir (it limits the cache)",
        ),
        (
            lambda: ErrorPolicy(on_error="ignore"),
            "on_error must be one of ('raise', 'skip'), got 'ignore'",
        ),
        (
            lambda: ErrorPolicy(max_skipped=3),
            "max_skipped=3 needs on_error='skip' (nothing is skipped)",
        ),
        (
            lambda: ErrorPolicy(on_error="skip", max_skipped=True),
            "max_skipped must be None or >= 0, got True",
        ),
        (lambda: Mix([]), "a mix needs a non-empty list of MixSource"),
        (
            lambda: Mix([MixSource("x")], batching="random"),
            "batching must be one of ('mixed', 'stratified'), got 'random'",
        ),
        (
            lambda: Mix([MixSource("x")], epoch_samples=0),
            "epoch_samples must be >= 1, got 0",
        ),
        (
            lambda: LoaderOptions(
                split="train", batch_size=4, workers=WorkerOptions(persistent_workers=True)
            ),
            "persistent_workers and prefetch_factor need num_workers > 0",
        ),
        (
            lambda: LoaderOptions(
                split="train",
                batch_size=4,
                workers=WorkerOptions(multiprocessing_context="spawn"),
            ),
            "multiprocessing_context='spawn' needs num_workers > 0 (with num_workers=0 batches "
            "are made in the main process)",
        ),
        (
            lambda: LoaderOptions(
                split="train",
                batch_size=4,
                collate_fn=len,
                decode=DecodeOptions(collate_options={"tokenizer": 1}),
            ),
            "collate_options=['tokenizer'] would be unused: collate_fn is a callable (they "
            "configure a registered collator given by name)",
        ),
        (lambda: LoaderOptions(split="train", batch_size=0), "batch_size must be >= 1, got 0"),
    ],
)
def test_an_invalid_option_is_refused_by_its_object(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


def test_fields_as_a_string_and_a_wrong_object_are_type_errors(ds):
    with pytest.raises(TypeError) as err:
        DecodeOptions(fields="vec")
    assert str(err.value) == "fields must be a sequence of field names, not the string 'vec'"
    with pytest.raises(TypeError) as err:
        create_loader(ds, "train", 4, plan=Topology())
    assert str(err.value) == "plan must be a PlanOptions, got Topology"


def test_distributed_with_an_explicit_topology_is_an_error(ds):
    with pytest.raises(ValueError) as err:
        create_loader(ds, "train", 4, distributed=True, topology=Topology(rank=0, world_size=1))
    assert str(err.value) == (
        "rank=0 / world_size=1 would be unused: distributed=True takes them from torch.distributed"
    )
    with pytest.raises(ValueError, match="^device_mesh gives the data-parallel rank and size"):
        create_loader(ds, "train", 4, distributed=True, topology=Topology(device_mesh=MESH))


def test_a_keyword_and_its_object_field_disagreeing_is_an_error(ds):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError) as err:
        create_loader(ds, "train", 4, plan=PlanOptions(span=3), span=5)
    assert str(err.value) == "span=5 conflicts with plan.span=3; give it in one place"
    # agreeing, or the object leaving the field at its default: merged
    with pytest.warns(DeprecationWarning):
        agreed = create_loader(ds, "train", 4, plan=PlanOptions(span=3), span=3, shuffle_window=8)
    assert (agreed.dataset_obj.config.span, agreed.dataset_obj.config.window) == (3, 8)


def test_storage_options_given_twice_must_agree_and_show_no_secret(ds):
    read = ReadOptions(storage_options={"key": "id", "secret": "s3cr3t"})
    with pytest.raises(ValueError) as err:
        create_loader(ds, "train", 4, storage_options={"anon": True}, read_options=read)
    assert str(err.value) == (
        "storage_options={'anon': True} conflicts with read_options.storage_options="
        "{'key': '***', 'secret': '***'}; give it in one place"
    )
    same = {"key": "id", "secret": "s3cr3t"}
    loader = no_deprecation(create_loader, ds, "train", 4, storage_options=same, read_options=read)
    assert loader.dataset_obj.store.options == read


def test_an_unknown_keyword_is_a_type_error_like_pythons(ds):
    with pytest.raises(TypeError) as err:
        create_loader(ds, "train", 4, shufle_window=8)
    assert str(err.value) == "create_loader() got an unexpected keyword argument 'shufle_window'"


def test_options_are_frozen():
    options = LoaderOptions(split="train", batch_size=4)
    for obj, field in [
        (options, "seed"),
        (options.plan, "span"),
        (Mix([MixSource("x")]), "batching"),
    ]:
        with pytest.raises(AttributeError):
            setattr(obj, field, 1)
