"""Exercise cells of the notebooks, their solutions (notebooks/solutions/) and recorded mistakes
(tests/exercise_mistakes/), read by ``tools.cells``."""
from __future__ import annotations

from pathlib import Path

from tools import cells

ROOT = Path(__file__).resolve().parent.parent

SOURCES = ROOT / "notebooks" / "src"
SOLUTIONS = ROOT / "notebooks" / "solutions"
MISTAKES = ROOT / "tests" / "exercise_mistakes"


def exercise_cells(path: Path) -> list[tuple[str, str]]:
    """(exercise id, cell source) for every exercise cell of a notebook source (jupytext's percent format), a
    solutions file or a file of recorded mistakes (``# %% exercise NN.name`` snippets), in order."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    if path.parent != SOURCES:
        return cells.named(text)
    return [(c.metadata["labkit"]["exercise"], c.source) for c in cells.parse(text)
            if c.cell_type == "code" and "labkit" in c.metadata]


def all_cells(folder: Path) -> dict[str, list[str]]:
    """Exercise id → every cell for it in ``folder``'s files (a mistakes file may hold several per id)."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.py")):
        for ex_id, src in exercise_cells(path):
            out.setdefault(ex_id, []).append(src)
    return out


def notebook_exercises() -> list[tuple[str, str, str]]:
    """(notebook stem, exercise id, placeholder source) for every exercise in notebooks/src."""
    return [(p.stem, ex_id, src) for p in sorted(SOURCES.glob("*.py")) for ex_id, src in exercise_cells(p)]


def run_cell(source: str, where: str) -> dict:
    """Execute a self-contained cell in a fresh namespace; return the namespace."""
    ns: dict = {"__name__": "__exercise__"}
    exec(compile(source, where, "exec"), ns)
    return ns
