"""Every link of README.md and docs/ to a local file or heading resolves (no build needed).

The strict docs build (tests/test_docs_build.py) checks the links inside docs/ too, but it needs the
docs packages; this check runs everywhere and covers README.md, whose links point into docs/.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without code blocks and code spans (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc gives a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors of the headings of ``page``."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*#*$", text, re.M)}


def broken_links(page: pathlib.Path) -> list[str]:
    """The local links of ``page`` whose file or heading does not exist, as ``target: why``."""
    bad = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not local
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(
                f"{target}: no file {dest.relative_to(ROOT) if ROOT in dest.parents else dest}"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_resolves(page):
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#two-words) [gone](docs/b.md) [bad anchor](docs/a.md#three)\n"
        "`[code](not/a/link.md)` [web](https://example.com/x.md) [self](#readme)\n"
        "```\n[fenced](nope.md)\n```\n# README\n"
    )
    assert broken_links(page) == [
        "docs/b.md: no file docs/b.md",
        "docs/a.md#three: no heading with anchor #three in docs/a.md",
    ]


def test_the_readme_gives_the_two_commands_and_links_every_page():
    """``.ci/run`` runs README's test command; the README links every page of the docs site."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("\n## Two commands\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"], ["make", "test"]]
    linked = {t.partition("#")[0] for t in _LINK.findall(_prose(text))}
    pages = {str(p.relative_to(ROOT)) for p in PAGES[1:] if p.name != "index.md"}
    assert pages - linked == set()
