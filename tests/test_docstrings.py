"""The packages' docstrings and comments, and the docs pages, speak to users: no ticket names.

The API reference (docs/reference/) is generated from these docstrings, so a docstring that cites
"seed 001" or "issue 20" shows a user a name that means nothing outside the project's tracker.
Say what the behaviour is (or which public API a name comes from) instead.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TICKET = re.compile(
    r"\bseeds? ?0\d\d\b|\bthe seeds?'s?(?=\s|$)|\bseeds' |\bissues? #?\d+\b|\bticket\b",
    re.IGNORECASE,
)


def ticket_names(text: str) -> list[str]:
    """The lines of ``text`` that cite a ticket, as ``LINE: text``."""
    return [
        f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if TICKET.search(line)
    ]


def test_the_pattern_finds_ticket_names():
    text = "ok\n(the seed's ``create_loader``)\nas in seed 001\nsee issue 20\nthe seed=0 rule\n"
    assert ticket_names(text) == [
        "2: (the seed's ``create_loader``)",
        "3: as in seed 001",
        "4: see issue 20",
    ]
    assert ticket_names("a random seed's bits\nseed 42 at epoch 1\nissued 3 reads") == []


def test_no_docstring_or_comment_cites_a_ticket():
    found = {
        str(path.relative_to(ROOT)): hits
        for package in ("wdsloader", "build_shards")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (hits := ticket_names(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_no_docs_page_cites_a_ticket():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {
        str(page.relative_to(ROOT)): hits
        for page in pages
        if (hits := ticket_names(page.read_text(encoding="utf-8")))
    }
    assert found == {}
