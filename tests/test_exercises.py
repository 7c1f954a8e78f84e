"""Exercises check themselves: every placeholder says 'not attempted', every solution 'correct', and every
recorded mistake 'wrong' — so each check can fail. Solutions are run here, cell by cell, not by re-running
whole notebooks."""
from __future__ import annotations

import ast
import difflib
import re

import pytest

from exercise_cells import MISTAKES, SOLUTIONS, SOURCES, all_cells, notebook_exercises, run_cell
from labkit.lessons import exercises

EXERCISES = notebook_exercises()
IDS = [ex_id for _, ex_id, _ in EXERCISES]
SOLVED = all_cells(SOLUTIONS)
WRONG = all_cells(MISTAKES)
NOTEBOOKS_WITH_EXERCISES = [f"{n:02d}" for n in range(1, 13) if n != 9]  # 01 … 12 but the capstone: at least two each


def _answer(ex_id: str, ns: dict):
    name = exercises.get(ex_id).name
    assert name in ns, f"the cell for {ex_id} must define {name!r}"
    return ns[name]


@pytest.mark.parametrize("stem,ex_id,source", EXERCISES, ids=IDS)
def test_placeholder_runs_and_is_not_attempted(stem, ex_id, source):
    assert ex_id.startswith(stem[:2]), f"{ex_id} sits in notebook {stem}: its id must start with {stem[:2]}"
    ns = run_cell(source, f"{stem}:{ex_id}")
    assert exercises.evaluate(ex_id, _answer(ex_id, ns)).status == "not attempted"


@pytest.mark.parametrize("ex_id", IDS)
def test_solution_is_correct(ex_id):
    assert len(SOLVED.get(ex_id, [])) == 1, f"notebooks/solutions/ needs exactly one cell '# %% exercise {ex_id}'"
    verdict = exercises.evaluate(ex_id, _answer(ex_id, run_cell(SOLVED[ex_id][0], f"solution {ex_id}")))
    assert verdict.status == "correct", verdict.line


@pytest.mark.parametrize("ex_id", IDS)
def test_each_recorded_mistake_is_called_wrong(ex_id):
    assert len(WRONG.get(ex_id, [])) >= 2, f"tests/exercise_mistakes/ needs at least two common mistakes for {ex_id}"
    for i, source in enumerate(WRONG[ex_id]):
        verdict = exercises.evaluate(ex_id, _answer(ex_id, run_cell(source, f"mistake {i} of {ex_id}")))
        assert verdict.status == "wrong" and verdict.because, f"mistake {i}: {verdict.line}"


def test_every_solution_and_mistake_belongs_to_an_exercise():
    assert not set(SOLVED) - set(IDS), f"solutions without an exercise cell: {sorted(set(SOLVED) - set(IDS))}"
    assert not set(WRONG) - set(IDS), f"mistakes without an exercise cell: {sorted(set(WRONG) - set(IDS))}"


def test_every_exercise_cell_is_followed_by_its_check():
    for path in sorted(SOURCES.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^# %%.*\bexercise (\S+)", text, flags=re.M):
            ex_id = m.group(1)
            rest = text[m.end():]
            nxt = re.search(r"^# %%(?! md).*$", rest, flags=re.M)  # the next code cell
            assert nxt and "check" in nxt.group(0).split(), f"{path.name}: {ex_id} needs a '# %% check' cell after it"
            body = rest[nxt.end():].split("\n# %%", 1)[0]
            assert f'exercises.check("{ex_id}", {exercises.get(ex_id).name})' in body, \
                f"{path.name}: the check cell after {ex_id} must call exercises.check(\"{ex_id}\", ...)"


def test_at_least_two_exercises_per_notebook():
    counts = {nb: sum(ex_id.startswith(nb) for ex_id in IDS) for nb in NOTEBOOKS_WITH_EXERCISES}
    assert all(n >= 2 for n in counts.values()), counts


def test_every_registered_check_is_used():
    unused = sorted(e.id for e in exercises.all_exercises()
                    if re.fullmatch(r"labkit\.lessons\.nb\d\d[a-z]?\.checks", e.check.__module__) and e.id not in IDS)
    assert not unused, f"checks no notebook uses: {unused}"


@pytest.mark.parametrize("ex_id", IDS)
def test_every_exercise_has_two_or_three_graded_hints(ex_id):
    hints = exercises.get(ex_id).hints
    assert 2 <= len(hints) <= 3, f"{ex_id}: write two or three hints (the idea first, nearly code last), not {len(hints)}"
    assert all(len(h.split()) >= 8 for h in hints), f"{ex_id}: a hint of fewer than eight words helps nobody"
    assert len(set(hints)) == len(hints), f"{ex_id}: two hints say the same"
    assert "`" in hints[-1], f"{ex_id}: the last hint is nearly code: show it in backticks"


@pytest.mark.parametrize("ex_id", IDS)
def test_each_recorded_mistake_names_the_hint_written_for_it(ex_id):
    n = len(exercises.get(ex_id).hints)
    for i, source in enumerate(WRONG[ex_id]):
        verdict = exercises.evaluate(ex_id, _answer(ex_id, run_cell(source, f"mistake {i} of {ex_id}")))
        assert verdict.hint is not None and 1 <= verdict.hint <= n, \
            f"mistake {i} of {ex_id}: raise Wrong(..., hint=k) (or close(..., hint=k)) naming the hint for it: {verdict.line}"
        assert f'exercises.hint("{ex_id}", {verdict.hint})' in verdict.line, verdict.line


TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\*\*|//|==|>=|<=|!=|[^\s\w]")
REVEAL_AT_MOST = 0.5  # a hint may show fragments of the solution's code, never most of it


def _solution_tokens(ex_id: str) -> list[str]:
    """The tokens of the solution's function body (its docstring and imports left out)."""
    fn = next(n for n in ast.parse(SOLVED[ex_id][0]).body
              if isinstance(n, ast.FunctionDef) and n.name == exercises.get(ex_id).name)
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    return TOKEN.findall("\n".join(ast.unparse(s) for s in body if not isinstance(s, (ast.Import, ast.ImportFrom))))


def revealed(solution: list[str], hint: str) -> float:
    """The share of the solution's tokens a hint's code (its backticked pieces) reproduces, in runs of 3 or more."""
    shown = [t for piece in re.findall(r"`([^`]+)`", hint) for t in [*TOKEN.findall(piece), "\0"]]
    blocks = difflib.SequenceMatcher(None, solution, shown, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks if b.size >= 3) / max(1, len(solution))


@pytest.mark.parametrize("ex_id", IDS)
def test_every_hint_stays_a_step_short_of_the_solution(ex_id):
    """The last hint used to be the solution's code (07.grow_table, 11.knee …): a learner who asks for every hint still
    writes the code themselves."""
    solution = _solution_tokens(ex_id)
    for n, hint in enumerate(exercises.get(ex_id).hints, start=1):
        share = revealed(solution, hint)
        assert share <= REVEAL_AT_MOST, f"{ex_id} hint {n} reproduces {share:.0%} of the solution's code: {hint}"


def test_the_step_short_rule_catches_a_hint_that_is_the_code():
    solution = TOKEN.findall("if length % block_size == 0:\n    table.append(free.pop(0))\nreturn table")
    assert revealed(solution, "When `length % block_size == 0`, do `table.append(free.pop(0))`; then return it.") > 0.5
    assert revealed(solution, "Test the position with the remainder operator `%`, then `pop` the first free block.") < 0.5
