"""A Mix as a JSON document (wdsloader.mix.mix_file): the training config and ``wdsloader
replay --mix`` build the same mix; bad documents are ValueErrors naming the file and key."""

from __future__ import annotations

import json
import re

import pytest

from wdsloader import Mix, MixSource
from wdsloader.curriculum import linear
from wdsloader.mix.mix_file import load_mix, mix_from_dict, mix_to_dict


def test_a_mix_round_trips_through_its_json_document(tmp_path):
    mix = Mix(
        [MixSource("s3://b/wiki", weight=0.7), MixSource("/d/code", name="code", weight=0.3),
         MixSource("/d/math", repeat=2.0)],
        weights=linear({"wiki": 0.9, "code": 0.1}, {"wiki": 0.5, "code": 0.5}, 4),
        epoch_samples=1000, batching="stratified",
    )  # fmt: skip
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix_to_dict(mix)))
    again = load_mix(path)
    assert again.sources == mix.sources
    assert again.spec_options().keys() == mix.spec_options().keys()
    assert again.weights.to_dict() == mix.weights.to_dict()
    assert [again.epoch_samples, again.batching] == [1000, "stratified"]
    assert mix_from_dict({"sources": ["/d/x"]}).sources == (MixSource("/d/x"),)


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        (
            {"sources": [{"url": "/a", "wieght": 1}]},
            "m.json: sources[0]: unknown keys ['wieght']; known: ['url', 'name'",
        ),
        ({"sources": [{"name": "x"}]}, "m.json: sources[0]: expected a URL or an object with"),
        ({"sources": ["/a"], "unit": "bytes"}, "m.json: unit must be one of"),
        ({"sources": ["/a"], "weights": {"kind": "nope"}}, "unknown kind 'nope'"),
    ],
)
def test_a_bad_mix_document_names_the_file_and_key(tmp_path, doc, error):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="^" + re.escape(path.as_posix())) as e:
        load_mix(path)
    assert error in str(e.value)
    path.write_text("{oops")
    with pytest.raises(ValueError, match=r"m\.json: not valid JSON"):
        load_mix(path)
