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


def build(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = parse(src.read_text(encoding="utf-8"))
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
