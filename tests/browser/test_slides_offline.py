"""The decks `make slides` built open from file:// with the network blocked: every slide is there,
reveal.js and MathJax load from the local copies, and every plotly chart draws its SVG."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from conftest import BUILD, ROOT, screenshot_path

pytestmark = pytest.mark.browser
from tools.slides import prepare

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def slide_count(nb: nbformat.NotebookNode) -> int:
    """Slides the deck must hold, from the prepared cells' slideshow metadata: the first shown cell
    opens a slide, then each 'slide' or 'subslide' cell opens another (continuations included)."""
    cells = prepare.prepare(nb).cells
    kinds = [c.metadata.get("slideshow", {}).get("slide_type", "-") for c in cells]
    first = next(i for i, k in enumerate(kinds) if k not in ("skip", "notes"))
    return 1 + sum(k in ("slide", "subslide") for k in kinds[first + 1:])


def plotly_outputs(nb: nbformat.NotebookNode) -> int:
    return sum("plotly-graph-div" in str(out.get("data", {}).get("text/html", ""))
               for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", []))


def open_deck(page, deck: Path) -> None:
    assert deck.is_file(), f"{deck} missing: `make slides` builds it"
    page.goto(deck.resolve().as_uri())
    page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_deck_renders_offline(notebook: Path, slides_dir: Path, offline_page) -> None:
    page = offline_page
    open_deck(page, slides_dir / f"{notebook.stem}.slides.html")
    executed = nbformat.read(BUILD / "executed" / notebook.name, as_version=4)
    expected = slide_count(executed)
    assert page.evaluate("Reveal.getTotalSlides()") == expected, "slides in the deck ≠ slide starts of the prepared notebook"
    assert page.evaluate("typeof MathJax === 'object' && typeof MathJax.typesetPromise === 'function'"), \
        "the local MathJax did not load"
    page.screenshot(path=str(screenshot_path(f"slides-{notebook.stem}-title")))

    n_plots = plotly_outputs(prepare.prepare(executed))
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == n_plots, "every plotly output of the executed notebook becomes a chart in the deck"
    for i in range(n_plots):
        assert plots.nth(i).locator(".main-svg").count() > 0, f"chart {i} drew no SVG"
    if n_plots:
        # go to the first chart's slide, let plotly fit it to the slide, and look at it
        page.evaluate("""() => { const s = document.querySelector('.js-plotly-plot').closest('section');
                                 const i = Reveal.getIndices(s); Reveal.slide(i.h, i.v, 99); }""")
        page.wait_for_timeout(500)
        box = plots.first.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 200, f"first chart is not visible: {box}"
        assert plots.first.locator(".main-svg g.trace path").count() > 0, \
            "the chart has axes but no data marks"
        page.screenshot(path=str(screenshot_path(f"slides-{notebook.stem}-chart")))

    assert not page.errors, f"script errors in the deck: {page.errors}"
    assert not page.network.blocked, f"the deck tried the network: {page.network.blocked}"


def test_some_deck_shows_a_chart() -> None:
    executed = sorted((BUILD / "executed").glob("*.ipynb"))
    assert executed, "no executed notebooks: `make run`"
    assert sum(plotly_outputs(nbformat.read(p, as_version=4)) for p in executed) > 0, \
        "no executed notebook has a plotly chart, so the decks' chart rendering is untested"


def test_index_links_every_deck(slides_dir: Path, offline_page) -> None:
    page = offline_page
    page.goto((slides_dir / "index.html").resolve().as_uri())
    hrefs = page.locator("a[href$='.slides.html']").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert sorted(hrefs) == sorted(f"{p.stem}.slides.html" for p in NOTEBOOKS)
    assert all((slides_dir / h).is_file() for h in hrefs)
    decks = json.loads((slides_dir / "decks.json").read_text(encoding="utf-8"))
    assert {d["name"] for d in decks} == {p.stem for p in NOTEBOOKS}
    page.screenshot(path=str(screenshot_path("slides-index")))
    assert not page.network.blocked, f"the index tried the network: {page.network.blocked}"
