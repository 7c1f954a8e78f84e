"""Every number a takeaway quotes comes from enough samples, and decks leave the learner's scaffolding out."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
# the knobs that set how many timed samples a quoted number has: at least 3 in quick mode, 5 in full
SAMPLE_KNOBS = ("REPEATS", "SWEEP_REPEATS", "PREFILL_REPEATS", "ROUNDS")
TIMED_NOTEBOOKS = ("01", "02", "03", "06", "07")


def _picks(text: str) -> dict[str, tuple[int, int]]:
    found = {}
    for name, full, quick in re.findall(r"^([A-Z_]+) = config\.pick\((\d+), (\d+)\)", text, re.M):
        if name in SAMPLE_KNOBS:
            found[name] = (int(full), int(quick))
    return found


def test_every_quoted_timing_has_at_least_three_samples_in_quick_mode():
    seen = {}
    for path in sorted(SRC.glob("*.py")):
        for name, (full, quick) in _picks(path.read_text(encoding="utf-8")).items():
            seen[f"{path.stem}.{name}"] = (full, quick)
    assert len([k for k in seen if k[:2] in TIMED_NOTEBOOKS]) >= len(TIMED_NOTEBOOKS), seen
    few = {k: v for k, v in seen.items() if v[1] < 3 or v[0] < 5}
    assert not few, f"quick mode needs n >= 3 and full mode n >= 5 (shrink tokens, not samples): {few}"
    assert _picks("REPEATS = config.pick(3, 1)\n") == {"REPEATS": (3, 1)}  # the lint sees a bad knob


def test_every_notebook_opens_with_the_load_line():
    missing = [p.stem for p in sorted(SRC.glob("*.py")) if 'machine.check("start")' not in p.read_text(encoding="utf-8")]
    assert not missing, f"these notebooks do not print the machine's load line first: {missing}"


def test_decks_drop_predictions_not_made_and_exercises_not_attempted():
    from tools.slides import prepare

    text = nbformat.v4.new_output("stream", name="stdout", text=(
        "decode at batch 1: no prediction made (set it in the prediction cell above and run this cell again)\n"
        "Exercise 03.nf4_quantize · NF4: not attempted (fill in the cell above, then run this one again)\n"
        "batch 1: measured 14.3 tokens/s\n"))
    kept = prepare.drop_scaffolding(text)
    assert kept is not None and kept["text"] == "batch 1: measured 14.3 tokens/s\n"
    only = nbformat.v4.new_output("stream", name="stdout", text="x: no prediction made (set it …)\n")
    assert prepare.drop_scaffolding(only) is None
    table = nbformat.v4.new_output("execute_result", data={
        "text/html": "<table><tr><th>exercise</th><th>status</th></tr><tr><td>07.grow_table</td>"
                     "<td>not attempted</td></tr></table>", "text/plain": "…"})
    assert prepare.drop_scaffolding(table) is None
    result = nbformat.v4.new_output("execute_result", data={"text/html": "<table><tr><td>1.9×</td></tr></table>"})
    assert prepare.drop_scaffolding(result) is result
