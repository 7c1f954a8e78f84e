"""Committed notebooks carry no outputs, match their sources, and follow the notebook shape."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_outputs(path):
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs: strip them (make notebooks)"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shape(path):
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    assert "Open in Colab" in "".join(cells[0]["source"]) and "setup" in cells[1]["metadata"].get("tags", [])
    assert cells[2]["cell_type"] == "markdown" and "".join(cells[2]["source"]).startswith("# "), "then the title"
    assert all("slideshow" in c["metadata"] for c in cells), "every cell needs slide metadata"
    assert sum("parameters" in c["metadata"].get("tags", []) for c in cells) == 1, "exactly one parameters cell"
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").lower()
    assert "objectives" in text and "takeaways" in text and "exercises" in text


def test_notebooks_match_sources():
    out = subprocess.run([sys.executable, "-m", "tools.nbbuild", "--check"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_run_all_runs_no_solution(path):
    """Solutions live in notebooks/solutions/: no notebook carries a solution cell (hidden or not)."""
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        tags = cell["metadata"].get("tags", [])
        assert "solution" not in tags, f"{path.name} cell {i} is a solution: move it to notebooks/solutions/"
        assert not cell["metadata"].get("jupyter", {}).get("source_hidden"), f"{path.name} cell {i} hides its code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_presenter_prose_is_speaker_notes(path):
    """Each notebook has presenter guidance as speaker notes (slide type 'notes'), and the deck keeps it."""
    import nbformat
    from tools.slides import prepare

    nb = nbformat.read(path, as_version=4)
    notes = [c for c in nb.cells if c.metadata.get("slideshow", {}).get("slide_type") == "notes"]
    assert notes, f"{path.name}: no speaker notes; add a '# %% md notes' cell for the presenter"
    assert all(c.cell_type == "markdown" for c in notes), f"{path.name}: a notes cell must be markdown"
    deck = prepare.prepare(nb)
    kept = [c for c in deck.cells if c.metadata.get("slideshow", {}).get("slide_type") == "notes"]
    assert len(kept) == len(notes), f"{path.name}: the deck dropped speaker notes"


@pytest.mark.parametrize("src", sorted((ROOT / "notebooks" / "src").glob("*.py")), ids=lambda p: p.stem)
def test_jupytext_reads_each_source_as_the_build_does(src):
    """The sources are jupytext's percent format: jupytext (and VS Code, JupyterLab's jupytext extension) opens each as
    the notebook nbbuild builds from it, cell for cell: type, source, slide type, tags and exercise id."""
    import jupytext

    from tools import cells

    theirs = jupytext.read(src).cells
    ours = cells.parse(src.read_text(encoding="utf-8"))
    assert len(theirs) == len(ours), f"{src.name}: jupytext sees {len(theirs)} cells, nbbuild {len(ours)}"
    for i, (a, b) in enumerate(zip(theirs, ours)):
        meta = {k: v for k, v in b.metadata.items() if not (k == "slideshow" and v == {"slide_type": "-"})}
        assert (a.cell_type, a.source) == (b.cell_type, b.source), f"{src.name} cell {i}"
        assert {k: v for k, v in a.metadata.items() if k in cells.KEYS} == meta, f"{src.name} cell {i}"


def test_the_cell_format_round_trips_and_refuses_what_it_does_not_know():
    from tools import cells

    text = ('# %% [markdown] slideshow={"slide_type": "slide"}\n# # Title\n#\n# text\n\n'
            '# %% labkit={"exercise": "99.f"} slideshow={"slide_type": "skip"} tags=["exercise"]\ndef f():\n    return 1\n')
    parsed = cells.parse(text)
    assert [c.cell_type for c in parsed] == ["markdown", "code"] and parsed[0].source == "# Title\n\ntext"
    again = cells.parse(cells.dumps(parsed))
    assert [(c.cell_type, c.source, c.metadata) for c in again] == [(c.cell_type, c.source, c.metadata) for c in parsed]
    for bad, why in [('# %% tags=["solution"]\nx = 1\n', "tags"), ('# %% slideshow={"slide_type": "big"}\n', "slide_type"),
                     ('# %% tags=["exercise"]\nx = 1\n', "both or neither"), ("# %% md slide\n# old\n", "key=JSON"),
                     ('# %% colour="red"\n', "unknown metadata")]:
        with pytest.raises(ValueError, match=why):
            cells.parse(bad)
