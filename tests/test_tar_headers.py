"""Malformed tar headers (PAX records, GNU long names, size fields, checksums, truncation) end
every reader quickly with a ShardFormatError naming the shard and the byte offset: the format
parser, the loader (raise and skip, gathered or not), the deep validation and adopt."""

from __future__ import annotations

import re
import shutil

import pytest

from build_shards.adopt import adopt
from tests.hostile_tar import CASES, END_OF_ARCHIVE, GOOD, SHARD, deadline, hostile_dataset
from wdsloader import create_loader, validate_dataset
from wdsloader.decode import parse_sample
from wdsloader.errors import ShardFormatError
from wdsloader.format import index_path, iter_members

GOOD_KEYS = [f"train{i:07d}" for i in range(GOOD)]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """``case -> (root, byte offset of the hostile sample)``, written on first use."""
    made: dict[str, tuple[str, int]] = {}

    def get(case: str) -> tuple[str, int]:
        if case not in made:
            root = str(tmp_path_factory.mktemp(case) / "ds")
            made[case] = (root, hostile_dataset(root, case))
        return made[case]

    return get


def _expected(source: str, at: int, case: str) -> str:
    return rf"{re.escape(source)} at byte {at}: .*{CASES[case][1]}"


def _loader(root: str, **kwargs):
    return create_loader(
        root, "train", batch_size=GOOD + 1, shuffle=False, drop_last=False, **kwargs
    )


@pytest.mark.parametrize("case", CASES)
def test_iter_members_names_the_offset(case):
    end = b"" if case == "truncated_header" else END_OF_ARCHIVE
    data = b"x" * 1024 + CASES[case][0] + end  # offsets count from a base
    with deadline(), pytest.raises(ShardFormatError, match=_expected("s.tar", 5000, case)):
        list(iter_members(data, 1024, base_offset=5000 - 1024, source="s.tar"))


@pytest.mark.parametrize("case", CASES)
def test_parse_sample_names_the_offset(case):
    hostile = CASES[case][0]
    data = hostile + END_OF_ARCHIVE
    with deadline(), pytest.raises(ShardFormatError, match=_expected("s.tar", 700, case)):
        parse_sample(data, 0, len(hostile), base_offset=700, source="s.tar")


@pytest.mark.parametrize("gather", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_loader_raises_naming_shard_and_offset(datasets, case, gather):
    root, at = datasets(case)
    loader = _loader(root, gather=gather)
    with deadline(), pytest.raises(ShardFormatError, match=_expected(SHARD, at, case)):
        list(loader)


@pytest.mark.parametrize("case", CASES)
def test_loader_skips_the_sample(datasets, case):
    root, _ = datasets(case)
    loader = _loader(root, on_error="skip")
    with deadline():
        keys = [k for batch in loader for k in batch["__key__"]]
    assert keys == GOOD_KEYS
    assert loader.stats["skipped_samples"] == 1


@pytest.mark.parametrize("case", CASES)
def test_deep_validation_reports_the_sample(datasets, case):
    root, at = datasets(case)
    with deadline():
        report = validate_dataset(root, deep=True)
    if case == "truncated_header":  # the index already ends off a block boundary
        (line,) = report.problems
        assert re.search(rf"{re.escape(index_path(SHARD))}: rule index: offset #{GOOD + 1} ", line)
        return
    (line,) = [p for p in report.problems if "rule parse" in p]
    assert re.search(rf"^{re.escape(SHARD)}: .*sample #{GOOD}: at byte {at}: .*", line)
    assert re.search(CASES[case][1], line)


@pytest.mark.parametrize("case", CASES)
def test_adopt_refuses_the_shard(datasets, tmp_path, case):
    root, at = datasets(case)
    (tmp_path / "train").mkdir()
    shutil.copy(f"{root}/{SHARD}", tmp_path / SHARD)
    with deadline(), pytest.raises(ShardFormatError, match=_expected(SHARD, at, case)):
        adopt(str(tmp_path))


@pytest.mark.parametrize("field", [b"+0000000002\0", b"0_000000002\0", b"-0000000002\0"])
def test_parse_sample_fast_path_refuses_what_the_parser_refuses(field):
    """A size with a sign or a digit separator (which int() accepts) is malformed on every path:
    the plain-header fast path of parse_sample must not read it as a size."""
    from tests.hostile_tar import header, members

    body = members()
    data = header("k.a", size_field=field) + b"xy".ljust(512, b"\0") + body + END_OF_ARCHIVE
    with pytest.raises(ShardFormatError, match=r"s\.tar at byte 0: bad size field"):
        parse_sample(data, 0, len(data) - len(END_OF_ARCHIVE), source="s.tar")
