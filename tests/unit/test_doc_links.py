"""Every relative link in the README and the docs resolves: the file exists, and a `#anchor` names
one of its headings (as GitHub spells a heading's anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import REPO

# The markdown a clone reads: the README, docs/ and each package's README.
DOCS = sorted({REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md")})
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", CODE.sub("", doc.read_text()), re.M)
    return {_anchor(h) for h in headings}


def _links(doc: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(CODE.sub("", doc.read_text()))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


def test_the_docs_are_found() -> None:
    assert REPO / "README.md" in DOCS and len(DOCS) > 10


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert broken == []


def test_the_anchor_rule() -> None:
    assert _anchor("LoRA adapters") == "lora-adapters"
    assert _anchor("Against SGLang's router and LiteLLM: `make bench-routers`") == (
        "against-sglangs-router-and-litellm-make-bench-routers"
    )
