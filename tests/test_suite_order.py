"""The suite's own order (tests/conftest.py): the tests that start Ray clusters of their own run
after the last test of the session's Ray, so that it is started once per session."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import own_rays_after_local_ray


def _item(name: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, fixturenames=("tmp_path", *fixtures))


def test_own_ray_tests_move_after_the_last_local_ray_test_and_the_rest_keep_their_order():
    items = [
        _item("a"),
        _item("build1", "local_ray"),
        _item("nodes", "without_local_ray"),
        _item("ranged"),
        _item("sources", "local_ray"),
        _item("z"),
    ]
    got = [item.name for item in own_rays_after_local_ray(items)]
    assert got == ["a", "build1", "ranged", "sources", "nodes", "z"]


def test_with_no_local_ray_test_own_ray_tests_run_last_and_a_suite_without_them_is_unchanged():
    items = [_item("nodes", "without_local_ray"), _item("a"), _item("b")]
    assert [i.name for i in own_rays_after_local_ray(items)] == ["a", "b", "nodes"]
    plain = [_item("a"), _item("b")]
    assert [i.name for i in own_rays_after_local_ray(plain)] == ["a", "b"]
