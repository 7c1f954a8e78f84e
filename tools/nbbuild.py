"""Build notebooks/*.ipynb from their sources in notebooks/src/*.py, jupytext's percent format (``tools.cells``).

    python -m tools.nbbuild                 build every notebook
    python -m tools.nbbuild --check         exit 1 when a committed .ipynb differs from what its source builds
    python -m tools.nbbuild --retime build/summary.json
                                            ``make run``'s step: re-time the notebooks of that quick run
                                            (``tools.agenda``) and rebuild the unedited ones, whose objectives
                                            slides state the time

Solutions never live in a notebook: they are in notebooks/solutions/NN_name.py, one snippet per
``# %% exercise NN.name`` line (``labkit.lessons.exercises``, ``tools.cells.named``).

Every notebook also gets, from one place each: first, its "Open in Colab / Kaggle" links and the set-up cell
(``labkit.platforms.setup_cell``, tagged ``setup``), both left out of the slides; in its "Learning objectives"
cell, its time (quick mode's compute time from ``data/agenda.json``, the latest timed run, with its machine and
date, and the reading and exercise time ``tools.agenda`` counts); last, the cell printing the learner's progress
(tagged ``progress``). Outputs are always empty: committed notebooks carry none.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat

from labkit import platforms
from tools import agenda, cells

ROOT = Path(__file__).resolve().parent.parent


OBJECTIVES = "## Learning objectives"
PROGRESS_CELL = ("# Your progress: every notebook's exercises (done / wrong / not tried) and predictions made.\n"
                 "# Stuck on one? exercises.hint(\"NN.name\") gives a hint, exercises.solution(\"NN.name\") its solution.\n"
                 "from labkit.lessons import exercises\n\nexercises.show_progress()")


def first_cells(stem: str) -> list[nbformat.NotebookNode]:
    """The links that open this notebook on Colab and Kaggle, and the set-up cell (out of the slides)."""
    skip = {"slideshow": {"slide_type": "skip"}}
    opens = "".join(f"[Open in {label}]({url}) · " for label, url in platforms.open_links(stem).items())
    links = (f"{opens}The next cell sets the lab up: on Colab or Kaggle it fetches labkit and installs what is missing, keeping "
             "the torch that is there, a few minutes the first time in a session and seconds after; on a laptop "
             "after `make lab` it only checks. On Kaggle, switch Internet on first (the notebook's Settings → "
             "Internet, which asks for a phone-verified account): without it nothing can be fetched.")
    return [nbformat.v4.new_markdown_cell(links, metadata=skip),
            nbformat.v4.new_code_cell(platforms.setup_cell(stem), metadata={**skip, "tags": ["setup"]})]


def time_line(src: Path) -> str:
    """How long the notebook takes: compute measured in quick mode (data/agenda.json), reading and exercises counted."""
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    if src.stem not in timings["wall_s"]:
        raise SystemExit(f"{agenda.TIMINGS} has no quick-mode time for {src.stem}: run it "
                         f"(LABKIT_QUICK=1 make run NOTEBOOKS={src.stem[:2]}), then python -m tools.agenda --summary "
                         "build/summary.json --merge --write")
    c = agenda.content(src)
    m = agenda.room_minutes(c, timings["wall_s"][src.stem], (timings.get("output_words") or {}).get(src.stem, 0))
    cores = f", {timings['cores']} cores" if timings.get("cores") else ""
    work = [f"{c['exercises']} exercise{'s' if c['exercises'] != 1 else ''}"] if c["exercises"] else []
    work += [f"{c['predictions']} prediction{'s' if c['predictions'] != 1 else ''}"] if c["predictions"] else []
    return (f"**Time:** compute {m['machine']:.1f} min in quick mode on {timings['machine']}{cores} (measured "
            f"{timings['date']}); about {m['reading'] + m['output'] + m['code']:.0f} min reading, its printed results "
            "included"
            + (f", and {m['exercises'] + m['predictions']:.0f} min for {' and '.join(work)}" if work else "")
            + " (`python -m tools.agenda`).")


def absolute_links(text: str) -> str:
    """Links into the checkout's docs (``](../docs/glossary.md#ttft)``) as links to the project's own copy, which
    resolve wherever the notebook runs: from a checkout, on Colab or Kaggle, in a deck."""
    return text.replace("](../docs/", f"]({platforms.docs_url()}")


def build(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    body = cells.parse(src.read_text(encoding="utf-8"))
    objectives = [c for c in body if c.cell_type == "markdown" and c.source.startswith(OBJECTIVES)]
    if len(objectives) != 1:
        raise ValueError(f"{src.name}: needs one markdown cell starting '{OBJECTIVES}' (found {len(objectives)})")
    objectives[0].source += "\n\n" + time_line(src)
    last = nbformat.v4.new_code_cell(PROGRESS_CELL, metadata={"slideshow": {"slide_type": "skip"}, "tags": ["progress"]})
    nb.cells = first_cells(src.stem) + body + [last]
    for cell in nb.cells:  # a notebook opened on Colab or Kaggle, or shown as a deck, has no ../docs beside it
        if cell.cell_type == "markdown":
            cell.source = absolute_links(cell.source)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{src.stem[:2]}-{i:03d}"
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "celltoolbar": "Slideshow",
    }
    return nb


def dumps(nb: nbformat.NotebookNode) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def retime(summary: Path) -> int:
    """``make run``'s step: re-time the notebooks of this run (``agenda.retimed``) and rebuild the notebooks whose
    .ipynb was what their source built, so their objectives slides state the new times; edited ones are kept."""
    sources = sorted((ROOT / "notebooks" / "src").glob("*.py"))
    unedited = [src for src in sources
                if (ROOT / "notebooks" / f"{src.stem}.ipynb").read_text(encoding="utf-8") == dumps(build(src))]
    said = agenda.retimed(summary)
    if said is None:
        return 0
    for src in unedited:
        (ROOT / "notebooks" / f"{src.stem}.ipynb").write_text(dumps(build(src)), encoding="utf-8")
    edited = sorted({p.stem for p in sources} - {s.stem for s in unedited})
    print(f"agenda: re-timed {said}; objectives slides rebuilt"
          + (f"; kept as you edited them: {edited} (python -m tools.nbbuild rebuilds them, replacing your edits)"
             if edited else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    ap.add_argument("--retime", type=Path, metavar="SUMMARY", help="re-time from a quick run's build/summary.json "
                    "(quick, every notebook passed, data/agenda.json's machine), then rebuild the unedited notebooks; "
                    "otherwise keep the times and say why")
    ap.add_argument("names", nargs="*", help="source stems to build (default: all)")
    args = ap.parse_args(argv)
    if args.retime:
        return retime(args.retime)
    srcs = sorted((ROOT / "notebooks" / "src").glob("*.py"))
    if args.names:
        srcs = [s for s in srcs if s.stem in args.names]
    stale = []
    for src in srcs:
        target = ROOT / "notebooks" / f"{src.stem}.ipynb"
        text = dumps(build(src))
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run `python -m tools.nbbuild`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
