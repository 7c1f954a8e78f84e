"""Build notebooks/*.ipynb from their percent-format sources in notebooks/src/*.py.

Cell markers (one per cell):
    # %% md [slide|subslide|fragment|skip|notes|-]     markdown; each line starts with "# "
    # %% [slide|...] [parameters]                     code; "parameters" tags the cell for papermill
    # %% exercise NN.name                             an exercise's fill-in cell (its placeholder runs);
                                                      tagged "exercise", left out of the slides
    # %% check                                        the cell that checks an exercise, likewise
    # %% [slide|...] mechanism                        code the lesson is about (a decode loop, a quantiser):
                                                      the slides show its source; other code cells show
                                                      only their output
Solutions never live in a notebook: they are in notebooks/solutions/NN_name.py, with the same
``# %% exercise NN.name`` markers (``labkit.lessons.exercises``).

Every notebook also gets, from one place each: first, its "Open in Colab / Kaggle" links and the set-up cell
(``labkit.platforms.setup_cell``), both left out of the slides; in its "Learning objectives" cell, its time (quick
mode's compute time from ``data/agenda.json``, the latest timed run, with its machine and date, and the reading and
exercise time ``tools/agenda.py`` counts); last, the cell printing the learner's progress.
Outputs are always empty: committed notebooks carry none. ``--check`` exits 1 when an
.ipynb differs from what its source builds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}


def parse(text: str) -> list[nbformat.NotebookNode]:
    cells: list[nbformat.NotebookNode] = []
    kind, words, lines = None, [], []

    def flush() -> None:
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        slide = next((w for w in words if w in SLIDE_TYPES), "-")
        meta: dict = {"slideshow": {"slide_type": slide}}
        if kind == "md":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.split("\n"))
            cell = nbformat.v4.new_markdown_cell(body, metadata=meta)
        else:
            tags = [w for w in words if w in ("parameters", "check", "mechanism")]
            if "exercise" in words:
                tags.append("exercise")
                meta["labkit"] = {"exercise": words[words.index("exercise") + 1]}
            if tags in (["check"], ["exercise"]) and slide == "-":
                meta["slideshow"]["slide_type"] = "skip"
            if tags:
                meta["tags"] = tags
            cell = nbformat.v4.new_code_cell(body, metadata=meta)
        cells.append(cell)

    for line in text.split("\n"):
        if line.startswith("# %%"):
            flush()
            words = line[4:].split()
            kind = "md" if words[:1] == ["md"] else "code"
            words = words[1:] if kind == "md" else words
            if "hide" in words:
                raise ValueError(f"{line!r}: solutions do not live in notebooks; put them in notebooks/solutions/ "
                                 "and give the notebook an exercise cell (# %% exercise NN.name) and a check cell")
            exercise_ids = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "exercise"]
            unknown = [w for w in words if w not in SLIDE_TYPES | {"parameters", "check", "exercise", "mechanism"}
                       and w not in exercise_ids]
            assert not unknown, f"unknown cell marker words {unknown} in {line!r}"
            assert words[-1:] != ["exercise"], f"{line!r}: name the exercise (# %% exercise NN.name)"
            lines = []
        else:
            lines.append(line)
    flush()
    return cells


OBJECTIVES = "## Learning objectives"
PROGRESS_CELL = ("# Your progress: every notebook's exercises (done / wrong / not tried) and predictions made.\n"
                 "# Stuck on one? exercises.hint(\"NN.name\") gives a hint, exercises.solution(\"NN.name\") its solution.\n"
                 "from labkit.lessons import exercises\n\nexercises.show_progress()")


def first_cells(stem: str) -> list[nbformat.NotebookNode]:
    """The links that open this notebook on Colab and Kaggle, and the set-up cell (out of the slides)."""
    sys.path.insert(0, str(ROOT))
    from labkit import platforms

    skip = {"slideshow": {"slide_type": "skip"}}
    links = (f"[Open in Colab]({platforms.colab_url(stem)}) · [Open in Kaggle]({platforms.kaggle_url(stem)}) · "
             "The next cell sets the lab up: on Colab or Kaggle it fetches labkit and installs what is missing, keeping "
             "the torch that is there, a few minutes the first time in a session and seconds after; on a laptop "
             "after `make lab` it only checks. On Kaggle, switch Internet on first (the notebook's Settings → "
             "Internet, which asks for a phone-verified account): without it nothing can be fetched.")
    return [nbformat.v4.new_markdown_cell(links, metadata=skip),
            nbformat.v4.new_code_cell(platforms.setup_cell(stem), metadata={**skip, "tags": ["setup"]})]


def time_line(src: Path) -> str:
    """How long the notebook takes: compute measured in quick mode (data/agenda.json), reading and exercises counted."""
    import agenda

    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    if src.stem not in timings["wall_s"]:
        raise SystemExit(f"{agenda.TIMINGS} has no quick-mode time for {src.stem}: run it "
                         f"(LABKIT_QUICK=1 make run NOTEBOOKS={src.stem[:2]}), then tools/agenda.py --summary "
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
            + " (`tools/agenda.py`).")


def absolute_links(text: str) -> str:
    """Links into the checkout's docs (``](../docs/glossary.md#ttft)``) as links to the project's own copy, which
    resolve wherever the notebook runs: from a checkout, on Colab or Kaggle, in a deck."""
    sys.path.insert(0, str(ROOT))
    from labkit import platforms

    return text.replace("](../docs/", f"]({platforms.docs_url()}")


def build(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    cells = parse(src.read_text(encoding="utf-8"))
    objectives = [c for c in cells if c.cell_type == "markdown" and c.source.startswith(OBJECTIVES)]
    if len(objectives) != 1:
        raise ValueError(f"{src.name}: needs one markdown cell starting '{OBJECTIVES}' (found {len(objectives)})")
    objectives[0].source += "\n\n" + time_line(src)
    last = nbformat.v4.new_code_cell(PROGRESS_CELL, metadata={"slideshow": {"slide_type": "skip"}, "tags": ["progress"]})
    nb.cells = first_cells(src.stem) + cells + [last]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    ap.add_argument("names", nargs="*", help="source stems to build (default: all)")
    args = ap.parse_args(argv)
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
        print(f"out of date (run `python tools/nbbuild.py`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
