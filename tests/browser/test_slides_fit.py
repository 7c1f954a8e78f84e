"""Every slide of every deck fits the screen: at 1280×720 and 1920×1080, with all its fragments shown,
nothing runs past the slide's edges, nothing is clipped inside it (a code line, a table), and the slide's own box,
its padding included, is no taller than the slide (content ending on the last pixel once passed the element check
while its section ran 739 px tall).

One browser page per screen size visits every slide of every deck (no restart per slide). A failure
names the deck, the slide (its number as the deck shows it, and reveal's h/v indices) and what
overflows by how many slide pixels. The fit check itself is tested on a deck built to overflow.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from conftest import BUILD, screenshot_path

pytestmark = pytest.mark.browser
from tools.slides import build

SIZES = [(1280, 720), (1920, 1080)]

# For each slide: show it with every fragment, fit its charts, then find what leaves the slide's box
# (compared in screen pixels, reported in slide pixels) or is clipped by an element that scrolls or
# hides its overflow. A plotly chart and a MathJax formula count as one box each.
MEASURE_JS = """
async () => {
  const container = () => document.querySelector('.reveal .slides').getBoundingClientRect();
  const describe = el => {
    const cls = (el.getAttribute('class') || '').split(/\\s+/).filter(c => c && !c.startsWith('jp-mod')).slice(0, 2);
    const text = (el.innerText || el.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 60);
    return `<${el.tagName.toLowerCase()}${cls.length ? '.' + cls.join('.') : ''}>` + (text ? ` "${text}"` : '');
  };
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const out = [];
  const all = Reveal.getSlides();
  for (let n = 0; n < all.length; n++) {
    const slide = all[n];
    const idx = Reveal.getIndices(slide);
    Reveal.slide(idx.h, idx.v || 0, 1e6);
    while (Reveal.nextFragment()) {}
    await frame();
    if (window.labkitFit) await window.labkitFit(slide);
    await frame();
    const box = container();
    const scale = box.height / Reveal.getConfig().height;
    const tol = 1.5 * scale;
    const worst = {};
    // the slide's bottom padding is the slide's margin: visible content must end above it (a trailing margin,
    // invisible, may run into it, as it may run past the slide)
    const padBottom = parseFloat(getComputedStyle(slide).paddingBottom) * scale;
    const note = (kind, px, el) => {
      px = Math.round(px / scale);
      if (!worst[kind] || px > worst[kind].px) worst[kind] = {kind, px, what: describe(el)};
    };
    for (const el of slide.querySelectorAll('*')) {
      if (el.closest('aside.notes')) continue;
      const leaf = el.closest('.js-plotly-plot, mjx-container');
      if (leaf && leaf !== el) continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.bottom > box.bottom + tol) note('past the bottom', r.bottom - box.bottom, el);
      else if (r.bottom > box.bottom - padBottom + tol) note('into the bottom margin', r.bottom - (box.bottom - padBottom), el);
      if (r.right > box.right + tol) note('past the right edge', r.right - box.right, el);
      if (r.left < box.left - tol) note('past the left edge', box.left - r.left, el);
      const cs = getComputedStyle(el);
      if (cs.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1)
        note('clipped on the right', (el.scrollWidth - el.clientWidth) * scale, el);
      if (cs.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 1)
        note('clipped at the bottom', (el.scrollHeight - el.clientHeight) * scale, el);
    }
    out.push({number: n + 1, h: idx.h, v: idx.v || 0, problems: Object.values(worst)});
  }
  return out;
}
"""


def open_deck(page, deck: Path) -> None:
    page.goto(deck.resolve().as_uri())
    page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)


def measure_deck(page, deck: Path) -> list[dict]:
    """Every slide of ``deck``: its number, h/v indices and what overflows (empty when it fits)."""
    open_deck(page, deck)
    return page.evaluate(MEASURE_JS)


def overflows(measured: list[dict], deck: str, size: tuple[int, int]) -> list[str]:
    return [f"{deck} at {size[0]}×{size[1]}, slide {s['number']} (h {s['h']}, v {s['v']}): {p['what']} {p['kind']} "
            f"by {p['px']} px" for s in measured for p in s["problems"]]


@pytest.fixture(scope="module")
def fit_pages(browser):
    pages = {}
    for w, h in SIZES:
        context = browser.new_context(viewport={"width": w, "height": h})
        context.route("**", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:", "blob:", "about:"))
                      else r.abort())
        pages[(w, h)] = context.new_page()
    yield pages
    for page in pages.values():
        page.context.close()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_slide_of_every_deck_fits(size: tuple[int, int], slides_dir: Path, fit_pages) -> None:
    decks = json.loads((slides_dir / "decks.json").read_text(encoding="utf-8"))
    assert decks, "no decks: `make slides`"
    page = fit_pages[size]
    problems, counts = [], {}
    for d in decks:
        measured = measure_deck(page, slides_dir / d["path"])
        counts[d["name"]] = {"slides": len(measured), "overflowing": sum(bool(s["problems"]) for s in measured)}
        problems += overflows(measured, d["name"], size)
        for s in measured:
            if s["problems"]:
                page.evaluate(f"Reveal.slide({s['h']}, {s['v']}, 1e6)")
                page.screenshot(path=str(screenshot_path(f"overflow-{d['name']}-{s['number']}-{size[0]}")))
    report = BUILD / "slides" / f"fit-{size[0]}x{size[1]}.json"
    report.write_text(json.dumps({"decks": counts, "overflows": problems}, indent=1) + "\n", encoding="utf-8")
    total = sum(c["slides"] for c in counts.values())
    assert not problems, f"{len(problems)} overflow(s) in {total} slides:\n" + "\n".join(problems)


def _overflowing_notebook(path: Path) -> Path:
    """Three slides: one that fits, one with a line too wide to wrap, one with a block too tall."""
    nb = nbformat.v4.new_notebook()
    wide = "<div style='width:1800px;white-space:nowrap'>" + "a_very_long_identifier_" * 60 + "</div>"
    tall = "<div style='height:1500px;background:#eee'></div>"
    nb.cells = [nbformat.v4.new_markdown_cell("# Fits\n\nOne short line.", metadata={"slideshow": {"slide_type": "slide"}}),
                nbformat.v4.new_code_cell("wide()", metadata={"slideshow": {"slide_type": "slide"}}, outputs=[
                    nbformat.v4.new_output("display_data", data={"text/html": wide})]),
                nbformat.v4.new_code_cell("tall()", metadata={"slideshow": {"slide_type": "slide"}}, outputs=[
                    nbformat.v4.new_output("display_data", data={"text/html": tall})])]
    nbformat.write(nb, path)
    return path


def test_the_fit_check_catches_an_overflowing_deck(tmp_path: Path, fit_pages) -> None:
    build.copy_assets(tmp_path)
    deck, n = build.export_deck(_overflowing_notebook(tmp_path / "98_overflow.ipynb"), tmp_path)
    measured = measure_deck(fit_pages[(1280, 720)], deck)
    assert n == len(measured) == 3
    found = overflows(measured, "98_overflow", (1280, 720))
    assert not measured[0]["problems"], f"the first slide fits: {found}"
    assert any("slide 2 " in p and "past the right edge" in p for p in found), found
    assert any("slide 3 " in p and "past the bottom" in p for p in found), found
