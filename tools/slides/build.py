"""Build one reveal.js deck per executed notebook in build/slides/, working with no internet (``make slides``).

The decks are made from build/executed/*.ipynb (``make run``; a missing executed copy is
run first) with nbconvert's slides exporter and a template (tools/slides_template/) whose
assets are all local: reveal.js and MathJax 3 come from node_modules (``npm ci``, see
package.json) and are copied next to the decks; plotly.js is already embedded in the
executed notebooks by labkit.lessons.plots.setup_offline(). Before export, ``prepare`` turns the
notebook into what a presenter shows; live widgets become a note (a deck has no kernel to drive them).
A deck that still references a remote script or stylesheet fails the build.

    python -m tools.slides                # every notebook
    python -m tools.slides --only 00 01   # a subset
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import nbformat

from tools import run_notebooks
from tools.slides.layout import expected_slides
from tools.slides.prepare import prepare
from tools.slides.rules import CHART_MAX_PX, CHART_MIN_PX, SLIDE_H, SLIDE_W


ROOT = run_notebooks.ROOT
BUILD_DIR = run_notebooks.BUILD_DIR
NODE_MODULES = ROOT / "node_modules"
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "slides_template"
REVEAL_DIR = "reveal.js"  # relative to the decks: --SlidesExporter.reveal_url_prefix
STATIC_DIR = "static"  # MathJax
# plotly's figure HTML asks for MathJax from a CDN; the deck loads its own local MathJax 3
_PLOTLY_MATHJAX_CDN = re.compile(r"<script[^>]*\bsrc=[\"']https?://[^\"']*mathjax[^\"']*[\"'][^>]*>\s*</script>",
                                 re.IGNORECASE)


# resources a browser would load (not plain <a href> links)
_REMOTE_LOAD = re.compile(
    r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)"
    r"|\bimport\s*(?:[\w{}\s,*]+from\s*)?[\"']((?:https?:)?//[^\"']+)[\"']"
    r"|@import\s+url\(\s*[\"']?((?:https?:)?//[^\"')]+)",
    re.IGNORECASE)


@dataclass
class Deck:
    name: str
    title: str
    path: str  # relative to the slides folder
    n_slides: int
    status: str  # the notebook's run status from build/summary.json, "unknown" without one
    wall_s: float | None


def ensure_node_modules(node_modules: Path = NODE_MODULES) -> None:
    """reveal.js and MathJax from the npm registry, installed once from package-lock.json."""
    needed = [node_modules / "reveal.js" / "dist" / "reveal.js", node_modules / "mathjax" / "es5" / "tex-svg-full.js"]
    if all(p.is_file() for p in needed):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("reveal.js is not installed and npm is missing: install Node.js (which brings npm), "
                           "then run `npm ci` in the repository root (or `make slides` again)")
    lock = (ROOT / "package-lock.json").is_file()
    cmd = [npm, "ci" if lock else "install", "--no-audit", "--no-fund"]
    print("installing reveal.js and MathJax:", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise RuntimeError(f"npm finished but these files are missing: {missing}")


def copy_assets(slides_dir: Path, node_modules: Path = NODE_MODULES) -> None:
    """reveal.js (dist + plugins) and one self-contained MathJax file next to the decks."""
    reveal = slides_dir / REVEAL_DIR
    for sub in ("dist", "plugin"):
        shutil.copytree(node_modules / "reveal.js" / sub, reveal / sub, dirs_exist_ok=True)
    (slides_dir / STATIC_DIR / "mathjax").mkdir(parents=True, exist_ok=True)
    shutil.copy2(node_modules / "mathjax" / "es5" / "tex-svg-full.js", slides_dir / STATIC_DIR / "mathjax")


def remote_references(text: str) -> list[str]:
    """URLs of scripts, stylesheets, images or modules the page would fetch from the network."""
    return sorted({next(g for g in m.groups() if g) for m in _REMOTE_LOAD.finditer(text)})


def make_offline(text: str) -> str:
    return _PLOTLY_MATHJAX_CDN.sub("", text)


def _exporter():
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    c = Config()
    c.SlidesExporter.reveal_url_prefix = REVEAL_DIR
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_transition = "none"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_width = str(SLIDE_W)
    c.SlidesExporter.reveal_height = str(SLIDE_H)
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATE_DIR)]
    c.SlidesExporter.template_name = "labkit_reveal"
    c.SlidesExporter.exclude_input_prompt = True
    c.SlidesExporter.exclude_output_prompt = True
    return SlidesExporter(config=c)


def _title(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def export_deck(executed: Path, slides_dir: Path) -> tuple[Path, int]:
    """Write <name>.slides.html; returns its path and the number of slides it holds."""
    nb = prepare(nbformat.read(executed, as_version=4))
    body, _ = _exporter().from_notebook_node(nb, resources={
        "labkit_static": STATIC_DIR, "labkit_chart_min_px": CHART_MIN_PX, "labkit_chart_max_px": CHART_MAX_PX,
        "metadata": {"name": _title(nb, executed.stem)}})
    body = make_offline(body)
    remote = remote_references(body)
    if remote:
        raise RuntimeError(f"{executed.name}: the deck would fetch {remote} from the network; "
                           "make these local in tools/slides/build.py")
    out = slides_dir / f"{executed.stem}.slides.html"
    out.write_text(body, encoding="utf-8")
    return out, expected_slides(nb)


def _index_html(decks: list[Deck], have_summary: bool) -> str:
    rows = []
    for d in decks:
        cls = "ok" if d.status == "ok" else "bad"
        wall = f"{d.wall_s:.1f} s" if d.wall_s is not None else "–"
        rows.append(f"<tr><td><a href='{html.escape(d.path)}'>{html.escape(d.title)}</a></td>"
                    f"<td>{d.n_slides}</td><td class='{cls}'>{html.escape(d.status)}</td><td>{wall}</td></tr>")
    summary = "<p><a href='../summary.html'>Run summary</a> (status, wall time and key results of every notebook)</p>" \
        if have_summary else ""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit slides</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em;max-width:900px}table{border-collapse:collapse}"
            "td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left}.ok{color:#1a7f37}.bad{color:#cf222e}"
            "</style></head><body><h1>labkit slide decks</h1>"
            "<p>Open a deck; arrows or space to move, <kbd>s</kbd> for speaker notes, <kbd>f</kbd> for full screen. "
            "Everything here works offline.</p>" + summary +
            "<table><tr><th>deck</th><th>slides</th><th>notebook run</th><th>run time</th></tr>"
            + "".join(rows) + "</table></body></html>\n")


def build(only: list[str] | None = None, build_dir: Path = BUILD_DIR, timeout_s: int = 900) -> list[Deck]:
    notebooks = run_notebooks.discover(only)
    if not notebooks:
        raise ValueError(f"no notebooks in {run_notebooks.NOTEBOOKS_DIR}")
    executed_dir = build_dir / "executed"
    missing = [p for p in notebooks if not (executed_dir / p.name).is_file()]
    if missing:
        print(f"no executed copy of {[p.stem for p in missing]}: running them first", flush=True)
        run_notebooks.run_all(missing, build_dir, timeout_s)
    for p in notebooks:
        if p.stat().st_mtime > (executed_dir / p.name).stat().st_mtime:
            print(f"warning: build/executed/{p.name} is older than {p.relative_to(ROOT)}; `make run` refreshes it",
                  flush=True)
    ensure_node_modules()
    slides_dir = build_dir / "slides"
    slides_dir.mkdir(parents=True, exist_ok=True)
    copy_assets(slides_dir)
    summary_path = build_dir / "summary.json"
    runs: dict[str, Any] = {}
    if summary_path.is_file():
        runs = {r["name"]: r for r in json.loads(summary_path.read_text(encoding="utf-8"))["notebooks"]}
    decks = []
    for p in notebooks:
        out, n = export_deck(executed_dir / p.name, slides_dir)
        run = runs.get(p.stem, {})
        title = _title(nbformat.read(p, as_version=4), p.stem)
        decks.append(Deck(name=p.stem, title=title, path=out.name, n_slides=n,
                          status=run.get("status", "unknown"), wall_s=run.get("wall_s")))
        print(f"wrote {out.relative_to(build_dir.parent) if out.is_relative_to(build_dir.parent) else out} "
              f"({n} slides)", flush=True)
    # the index lists every deck present, also those built by an earlier, wider run
    listed = {d.name for d in decks}
    for extra in sorted(slides_dir.glob("*.slides.html")):
        name = extra.name.removesuffix(".slides.html")
        if name not in listed and (executed_dir / f"{name}.ipynb").is_file():
            nb = nbformat.read(executed_dir / f"{name}.ipynb", as_version=4)
            run = runs.get(name, {})
            decks.append(Deck(name=name, title=_title(nb, name), path=extra.name, n_slides=expected_slides(prepare(nb)),
                              status=run.get("status", "unknown"), wall_s=run.get("wall_s")))
    decks.sort(key=lambda d: d.name)
    (slides_dir / "index.html").write_text(_index_html(decks, summary_path.is_file()), encoding="utf-8")
    (slides_dir / "decks.json").write_text(json.dumps([asdict(d) for d in decks], indent=2) + "\n", encoding="utf-8")
    print(f"index: {(slides_dir / 'index.html')}", flush=True)
    return decks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="notebook names or number prefixes (default: all)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one cell may run, for notebooks run first")
    ap.add_argument("--build-dir", type=Path, default=BUILD_DIR)
    args = ap.parse_args(argv)
    try:
        build(args.only, args.build_dir, args.timeout)
    except ValueError as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
