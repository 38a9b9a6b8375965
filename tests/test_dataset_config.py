"""ShardStreamDataset is made from the LoaderConfig create_loader resolves (one object, no second
keyword list); the constructor's earlier keywords still work until 0.2.0, with a warning naming
the new call."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from tests.dataset_factory import write_dataset
from wdsloader import create_loader
from wdsloader.decode.registry import SampleDecoder
from wdsloader.mix import MixSource
from wdsloader.stream import LoaderConfig, ShardStreamDataset


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dsconfig")
    write_dataset(str(root / "a"), {"train": [9, 8]})
    write_dataset(str(root / "b"), {"train": [7]})
    return root


def _ids(dataset) -> list[list[int]]:
    return [batch["idx"].tolist() for batch in dataset]  # iterated in this process


def _loader(data: Path, **kw):
    return create_loader(str(data / "a"), "train", 4, seed=5, shuffle=True, **kw)


def test_the_dataset_is_made_from_the_loader_config(data):
    made = _loader(data, epoch=2, drop_last=False).dataset_obj
    config = made.loader_config
    assert isinstance(config, LoaderConfig) and made.config is config.plan
    again = ShardStreamDataset(config, made.manifest, made.store)
    assert again.epoch == 2 and len(again) == len(made)
    assert _ids(again) == _ids(made)
    other = ShardStreamDataset(dataclasses.replace(config, epoch=3), made.manifest, made.store)
    assert other.epoch == 3 and _ids(other) != _ids(made)


def test_a_mix_dataset_is_made_from_its_loader_config(data):
    made = create_loader([MixSource(data / "a"), MixSource(data / "b")], "train", 4).dataset_obj
    again = ShardStreamDataset(made.loader_config, made.manifest, made.store)
    assert again.mix is made.mix and _ids(again) == _ids(made)


def test_the_old_keywords_still_work_with_a_warning(data):
    made = _loader(data).dataset_obj
    with pytest.warns(DeprecationWarning) as caught:
        old = ShardStreamDataset(
            manifest=made.manifest, split="train", store=made.store, config=made.config, rank=0,
            decoder=SampleDecoder(made.manifest.schema, ["idx"], dims=made.manifest.dims),
            collate_fn=made.collate_fn, on_error="skip", max_skipped=3,
        )  # fmt: skip
    (warning,) = caught
    assert "goes away in wdsloader 0.2.0: use ShardStreamDataset(config, manifest, store) " in str(
        warning.message
    )
    assert warning.filename == __file__  # points at the code that made the dataset
    assert (old.on_error, old.max_skipped, old.fields, old.epoch) == ("skip", 3, ("idx",), 0)
    assert old.loader_config.plan is made.config
    assert _ids(old) == _ids(made)


def test_wrong_keywords_are_type_errors(data):
    made = _loader(data).dataset_obj
    old = {"manifest": made.manifest, "store": made.store, "config": made.config,
           "decoder": made.decoder, "collate_fn": made.collate_fn}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=r"missing required keywords \['split', 'rank'\]"):
            ShardStreamDataset(**old)
        with pytest.raises(TypeError, match=r"unexpected keywords \['bogus'\]"):
            ShardStreamDataset(**old, split="train", rank=0, bogus=1)
    with pytest.raises(TypeError, match=r"unexpected keywords \['rank'\]"):
        ShardStreamDataset(made.loader_config, made.manifest, made.store, rank=0)
    with pytest.raises(ValueError, match=r"rank 2 outside \[0, 1\)"):
        ShardStreamDataset(
            dataclasses.replace(made.loader_config, rank=2), made.manifest, made.store
        )
