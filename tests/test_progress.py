"""The self-paced learner's path: hints one at a time, one exercise's solution, a reset, and a progress record
that a run of the shipped notebooks leaves empty and a run of the solutions fills — none of it by Run All."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from exercise_cells import MISTAKES, SOLUTIONS, SOURCES, all_cells, notebook_exercises, run_cell
from labkit.lessons import exercises
from labkit.lessons.exercises import progress

ROOT = Path(__file__).resolve().parent.parent
from tools import agenda
from tools import merge_results
from tools import cells, nbbuild

EXERCISES = notebook_exercises()


@pytest.fixture(autouse=True)
def record(tmp_path, monkeypatch):
    file = tmp_path / "progress.json"
    monkeypatch.setenv("LABKIT_PROGRESS", str(file))
    monkeypatch.setattr(progress, "_NOTEBOOK", None)
    return file


def _run_checks(cells: dict[str, list[str]]) -> None:
    for ex_id, sources in sorted(cells.items()):
        ns = run_cell(sources[0], ex_id)
        exercises.check(ex_id, ns[exercises.get(ex_id).name])


def test_the_shipped_cells_leave_nothing_done_and_the_solutions_everything(capsys):
    _run_checks({ex_id: [src] for _, ex_id, src in EXERCISES})
    rows = progress.table([e for _, e, _ in EXERCISES])
    assert sum(r["done"] for r in rows) == 0 and sum(r["total"] for r in rows) == len(EXERCISES)
    assert all(e["status"] == "not tried" for r in rows for e in r["exercises"])
    _run_checks(all_cells(SOLUTIONS))
    rows = progress.table([e for _, e, _ in EXERCISES])
    assert sum(r["done"] for r in rows) == len(EXERCISES), progress.text(rows)
    out = subprocess.run([sys.executable, "-m", "labkit", "progress", "--json"], capture_output=True, text=True,
                         check=True).stdout
    cli = json.loads(out)
    assert sum(r["done"] for r in cli["notebooks"]) == len(EXERCISES)


def test_a_wrong_answer_is_recorded_as_wrong_and_names_its_hint(capsys):
    ex_id = "06.left_pad"
    ns = run_cell(all_cells(MISTAKES)[ex_id][0], "mistake")
    exercises.check(ex_id, ns["left_pad"])
    line = capsys.readouterr().out
    assert re.search(r'exercises\.hint\("06\.left_pad", \d\)', line), line
    assert progress.load()["exercises"][ex_id]["status"] == "wrong"
    assert "06 " in progress.text(progress.table([ex_id])) and "left_pad wrong" in progress.text(progress.table([ex_id]))


def test_hints_come_one_at_a_time_then_point_at_the_solution(capsys):
    ex = exercises.get("06.left_pad")
    for n in range(1, len(ex.hints) + 1):
        exercises.hint(ex.id)
        out = capsys.readouterr().out
        assert f"Hint {n} of {len(ex.hints)}" in out and ex.hints[n - 1] in out
        assert all(h not in out for i, h in enumerate(ex.hints) if i != n - 1), "one hint at a time"
    assert "exercises.solution('06.left_pad')" in out
    exercises.hint(ex.id)  # past the last: the last again
    assert f"Hint {len(ex.hints)} of" in capsys.readouterr().out
    exercises.hint(ex.id, 1)  # a named one, any time
    assert "Hint 1 of" in capsys.readouterr().out
    assert progress.hints_seen(ex.id) == len(ex.hints)
    with pytest.raises(ValueError, match="hints 1 to"):
        exercises.hint(ex.id, len(ex.hints) + 1)


def test_a_solution_shows_that_exercise_only_and_is_recorded(capsys):
    exercises.solution("06.left_pad")
    out = capsys.readouterr().out
    assert "def left_pad(" in out and "def step_inputs(" not in out
    exec(compile(out.split("run the check:\n", 1)[1], "shown", "exec"), ns := {})
    assert exercises.evaluate("06.left_pad", ns["left_pad"]).status == "correct"
    assert progress.load()["exercises"]["06.left_pad"]["solution"] is True
    exercises.solution("03.e4m3_round")  # 03b_fp8_fp4's exercise: notebook 03's number, its own file
    assert "def e4m3_round(" in capsys.readouterr().out


def test_reset_forgets_the_record_and_gives_back_the_cell_as_shipped(capsys):
    ns = run_cell(all_cells(SOLUTIONS)["06.step_inputs"][0], "solution")
    exercises.check("06.step_inputs", ns["step_inputs"])
    exercises.hint("06.step_inputs")
    capsys.readouterr()
    exercises.reset("06.step_inputs")
    out = capsys.readouterr().out
    assert "record cleared" in out and "06.step_inputs" not in progress.load()["exercises"]
    shipped = out.split("to paste back:\n", 1)[1]
    assert exercises.evaluate("06.step_inputs", run_cell(shipped, "shipped")["step_inputs"]).status == "not attempted"
    code = subprocess.run([sys.executable, "-m", "labkit", "progress", "--reset", "06.nope"], capture_output=True,
                          text=True)
    assert code.returncode == 2 and "no exercise '06.nope'" in code.stderr


def test_predictions_are_filed_under_the_running_notebook(capsys):
    exercises.reveal("decode tokens/s", None, 12.0, "tokens/s")
    assert progress.load()["predictions"] == {}, "no notebook set: nothing filed"
    progress.here("06_batching")
    exercises.reveal("decode tokens/s", None, 12.0, "tokens/s")
    exercises.reveal_choice("faster", "bf16", "fp32", ["bf16", "fp32"])
    row = next(r for r in progress.table([]) if r["notebook"] == "06")
    assert (row["predictions_made"], row["predictions_revealed"]) == (1, 2)
    assert "1 made of 2 revealed" in progress.text([row])


def test_a_damaged_record_is_an_error_naming_the_file(record):
    record.write_text("{not json", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "labkit", "progress"], capture_output=True, text=True)
    assert out.returncode == 2 and str(record) in out.stderr and "move it aside" in out.stderr


def test_no_notebook_asks_for_a_hint_a_solution_or_a_reset():
    for src in sorted(SOURCES.glob("*.py")):
        for cell in cells.parse(src.read_text(encoding="utf-8")):
            if cell.cell_type == "code":
                assert not re.search(r"exercises\.(hint|solution|reset)\(", cell.source), \
                    f"{src.name}: Run All must never show a hint or a solution"


@pytest.mark.parametrize("src", sorted(SOURCES.glob("*.py")), ids=lambda p: p.stem)
def test_every_notebook_opens_with_its_links_and_set_up_and_ends_with_progress(src):
    from labkit import platforms

    nb = nbbuild.build(src)
    links, setup, last = nb.cells[0], nb.cells[1], nb.cells[-1]
    opens = platforms.open_links(src.stem)
    assert set(opens) == {"Colab", "Kaggle"} and all(f"({url})" in links.source for url in opens.values())
    assert setup.cell_type == "code" and f'setup("{src.stem}")' in setup.source
    assert {links.metadata["slideshow"]["slide_type"], setup.metadata["slideshow"]["slide_type"]} == {"skip"}
    assert last.cell_type == "code" and "exercises.show_progress()" in last.source


@pytest.mark.parametrize("src", sorted(SOURCES.glob("*.py")), ids=lambda p: p.stem)
def test_the_objectives_state_the_measured_time(src):
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    objectives = next(c.source for c in nbbuild.build(src).cells if c.source.startswith(nbbuild.OBJECTIVES))
    line = objectives.splitlines()[-1]
    assert f"compute {timings['wall_s'][src.stem] / 60:.1f} min in quick mode on {timings['machine']}" in line
    assert f"measured {timings['date']}" in line
    minutes = agenda.room_minutes(agenda.content(src), 0, timings["output_words"][src.stem])
    assert f"about {minutes['reading'] + minutes['output'] + minutes['code']:.0f} min reading, its printed results " \
           "included" in line and ", (" not in line


def test_the_instructor_sees_where_the_room_is_stuck_when_learners_pack_progress(tmp_path, record, capsys):
    ns = run_cell(all_cells(SOLUTIONS)["06.left_pad"][0], "solution")
    exercises.check("06.left_pad", ns["left_pad"])
    exercises.hint("06.step_inputs")
    results_dir = tmp_path / "alice" / "results"
    results_dir.mkdir(parents=True)
    from labkit.core import results

    res = results.Results("06_batching")
    res.add("static", batch_size=1, tokens_per_s=10.0)
    res.save(results_dir / "06_batching.json")
    inbox = tmp_path / "inbox"
    merge_results.pack("alice", results_dir, inbox, record)
    merge_results.pack("bob", results_dir, inbox)  # no --progress: nothing of bob's record leaves his machine
    with zipfile.ZipFile(inbox / "labkit-results-bob.zip") as zf:
        assert merge_results.PROGRESS_MEMBER not in zf.namelist()
    info = merge_results.merge([inbox], tmp_path / "class")
    assert info["progress"] == ["alice"] and not info["skipped"]
    page = (tmp_path / "class" / "index.html").read_text(encoding="utf-8")
    assert "Where the room is stuck (1 learners" in page
    assert "<tr><td>06.left_pad</td><td>1</td><td>0</td><td>0</td><td>0</td><td>0</td></tr>" in page
    assert "<tr><td>06.step_inputs</td><td>0</td><td>0</td><td>1</td><td>1</td><td>0</td></tr>" in page
    with pytest.raises(ValueError, match="no progress record"):
        merge_results.pack("carol", results_dir, inbox, tmp_path / "missing.json")
