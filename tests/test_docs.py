"""The README a newcomer reads in five minutes, and documents whose links all resolve."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools import agenda

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 150


def test_the_readme_is_short_and_starts_the_reader():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md grew past a five-minute read: move detail to docs/"
    for must in ("notebooks/00_setup.ipynb", "make lab", "make test", "docs/setup.md", "docs/gpu.md",
                 "docs/instructor.md", "docs/glossary.md"):
        assert must in text, f"README.md no longer names {must}"


def test_the_readme_lists_every_notebook_with_its_measured_time():
    rows = agenda.table(json.loads(agenda.TIMINGS.read_text(encoding="utf-8")))
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = text[text.index(agenda.TABLE_START) + len(agenda.TABLE_START):text.index(agenda.TABLE_END)].strip()
    assert shown == agenda.readme_table(rows), "README.md's notebook table is stale: python -m tools.agenda --write"
    assert all(f"notebooks/{r['notebook']}.ipynb" in shown for r in rows)


def local_links(path: Path) -> list[str]:
    """Links of a markdown file to files of the checkout that do not exist (anchors and web links left out)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_resolves(doc):
    assert not local_links(doc), f"{doc.name} links to files that do not exist: {local_links(doc)}"


def test_the_link_check_catches_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("x", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](there.md) [b](gone.md#x) [c](https://example.org) [d](#top)\n```\n[e](not-checked.md)\n```\n",
                   encoding="utf-8")
    assert local_links(doc) == ["gone.md#x"]
