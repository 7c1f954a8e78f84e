"""Every takeaway of a run keeps, on its slide, what qualifies its numbers: after `make run`, each printed line the
deck shortens (``prepare.printed_prose``) shows every verdict word, "not this run", "reference", "estimate", bound
and machine or instance name its notebook printed, or goes to the speaker notes whole."""
from __future__ import annotations

import html
import re

import nbformat
import pytest

from conftest import BUILD
from tools.slides import prepare, rules

pytestmark = pytest.mark.browser
EXECUTED = sorted((BUILD / "executed").glob("[0-9][0-9]*_*.ipynb"))


def test_the_run_has_executed_notebooks_to_read() -> None:
    assert EXECUTED, "no executed notebooks in build/executed: `make run` first"


@pytest.mark.parametrize("path", EXECUTED, ids=[p.stem for p in EXECUTED])
def test_every_shortened_line_keeps_its_qualifiers(path) -> None:
    nb = nbformat.read(path, as_version=4)
    per_line = rules.CONTENT_W / rules.CODE_CHAR_PX
    lost, checked = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") != "stream":
                continue
            allowed = set()
            for line in rules._text(out["text"]).rstrip("\n").split("\n"):
                bullet = line.startswith("- ")
                if not bullet and len(line) <= per_line:
                    continue
                text = line[2:] if bullet else line.strip()
                short = prepare.shorten(text, rules.BULLET_MAX_CHARS if bullet else rules.PROSE_MAX_CHARS)
                checked += 1
                if short is not None and not prepare.qualifiers(short) >= prepare.qualifiers(text):
                    lost.append(f"{sorted(prepare.qualifiers(text) - prepare.qualifiers(short))}: {short!r}")
                allowed |= {text, short}
            new, _ = prepare.printed_prose(out)
            if new is not out:  # what the slide shows is one of those lines, whole or shortened, never another cut
                shown = [html.unescape(i) for i in re.findall(r"<(?:li|p)>(.*?)</(?:li|p)>",
                                                                      new["data"]["text/html"])]
                assert set(shown) <= allowed, f"{path.name}: a slide line the shortener did not make: {set(shown) - allowed}"
    assert not lost, f"{path.name}: {len(lost)} of {checked} lines shown without what qualifies them:\n" + "\n".join(lost)
