"""Relative links in the documentation resolve: every ``[text](path)`` and ``![alt](path)`` in
README.md, configs/README.md, docs/*.md and docs/lab/*.md names a file that exists, and a
``#anchor`` names a heading of its target (GitHub's slugs: lower case, punctuation dropped,
spaces to hyphens, repeats numbered)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

DOCS = sorted(
    [REPO / "README.md", REPO / "configs" / "README.md"]
    + list((REPO / "docs").glob("*.md"))
    + list((REPO / "docs" / "lab").glob("*.md"))
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The relative link targets of a markdown file (code blocks left out)."""
    text = FENCE.sub("", path.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists() or (dest.suffix == ".md" and anchor not in anchors(dest) | {""}):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


def test_the_recipe_index_lists_every_recipe() -> None:
    index = (REPO / "configs" / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.yaml)\)", index))
    shipped = {p.name for p in (REPO / "configs").glob("*.yaml")}
    assert listed == shipped, f"unlisted: {shipped - listed}; gone: {listed - shipped}"
