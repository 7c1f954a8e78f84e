"""The workshop agenda's arithmetic (tools/agenda.py) and the table docs/instructor.md prints from it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
from tools import agenda


def test_the_instructor_guide_prints_what_the_tool_computes():
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    doc = agenda.DOC.read_text(encoding="utf-8")
    shown = doc[doc.index(agenda.START) + len(agenda.START):doc.index(agenda.END)].strip()
    assert shown == agenda.markdown(agenda.table(timings), timings), \
        "docs/instructor.md's agenda is stale: python -m tools.agenda --write"


def test_the_three_hour_plan_fits_and_keeps_the_order():
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    rows = agenda.table(timings)
    kept, homework = agenda.plan(rows)
    assert sum(k["minutes"] for k in kept) + agenda.BREAK_MIN + agenda.WRAP_UP_MIN <= agenda.SESSION_MIN
    assert [k["notebook"] for k in kept] == list(agenda.CORE[:len(kept)]) and kept[0]["notebook"] == "00_setup"
    assert set(homework) | {k["notebook"] for k in kept} == {r["notebook"] for r in rows}
    slow = [{**r, "total_min": 200.0} if r["notebook"] == "01_hardware_sizing" else r for r in rows]
    kept, homework = agenda.plan(slow)
    assert [k["notebook"] for k in kept] == ["00_setup"] and homework[0] == "01_hardware_sizing"


def test_the_one_day_plan_fits_the_day_and_holds_03b_and_12():
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    rows = agenda.table(timings)
    slots, left = agenda.day_plan(rows)
    names = [what for _, what, _ in slots]
    assert "03b_fp8_fp4" in names and "12_serving_features" in names, (names, left)
    end = slots[-1][0] + slots[-1][2]
    assert slots[0][0] == agenda.DAY_OPEN_MIN and end <= agenda.DAY_CLOSE_MIN
    assert names.count("lunch") == 1 and set(left) | {n for n in names if n in agenda.FOCUS} == {r["notebook"] for r in rows}
    for (t, _, minutes), (t2, _, _) in zip(slots, slots[1:]):
        assert t + minutes == t2, "slots follow each other"
    doc = agenda.DOC.read_text(encoding="utf-8")
    shown = doc[doc.index(agenda.DAY_START) + len(agenda.DAY_START):doc.index(agenda.DAY_END)].strip()
    assert shown == agenda.day_markdown(rows), "docs/instructor.md's 1-day agenda is stale: python -m tools.agenda --write"


def test_every_notebook_has_its_printed_words_counted():
    timings = json.loads(agenda.TIMINGS.read_text(encoding="utf-8"))
    assert set(timings["output_words"]) == set(timings["wall_s"]) and all(
        isinstance(n, int) and n > 0 for n in timings["output_words"].values()), timings.get("output_words")


def test_room_time_counts_what_a_notebook_holds(tmp_path):
    src = tmp_path / "99_x.py"
    src.write_text('# %% [markdown] slideshow={"slide_type": "slide"}\n# one two three four\n\n'
                   '# %% [markdown] slideshow={"slide_type": "notes"}\n# presenter words are not read aloud\n\n'
                   "# %%\nPREDICT_A = None  # guess\nPREDICT_B = None\n\n"
                   '# %% labkit={"exercise": "99.f"} tags=["exercise"]\ndef f():\n    return None\n\n'
                   '# %% tags=["check"]\nprint(1)\n\n# %% tags=["mechanism"]\n# a comment\nx = 1\ny = 2\n', encoding="utf-8")
    c = agenda.content(src)
    assert c == {"words": 4, "mechanism_lines": 2, "predictions": 2, "exercises": 1}
    m = agenda.room_minutes(c, machine_s=90, output_words=400)
    assert m["output"] == pytest.approx(2.0)  # printed results read at 200 words a minute
    assert m["total"] == pytest.approx((4 / 150 + 2 + 2 / 10 + 2 * 1.5 + 6 + 1.5) * (1 + agenda.SLACK))
    assert 0.10 <= agenda.SLACK <= 0.15


def test_timings_come_only_from_a_quick_run_that_passed(tmp_path):
    base = {"quick": True, "environment": {"hardware": {"cpu": "c", "cpu_isa": ["avx2"]}, "date": "2026-12-04T00:00"},
            "notebooks": [{"name": "00_setup", "status": "ok", "wall_s": 17.0, "output_words": 321}]}
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(base), encoding="utf-8")
    assert agenda.timings_from(p)["wall_s"] == {"00_setup": 17.0} and agenda.timings_from(p)["machine"] == "c (avx2)"
    assert agenda.timings_from(p)["output_words"] == {"00_setup": 321}
    p.write_text(json.dumps({**base, "quick": False}), encoding="utf-8")
    with pytest.raises(SystemExit, match="full-mode"):
        agenda.timings_from(p)
    p.write_text(json.dumps({**base, "notebooks": [{"name": "00_setup", "status": "failed", "wall_s": 1.0}]}),
                 encoding="utf-8")
    with pytest.raises(SystemExit, match="did not finish"):
        agenda.timings_from(p)
