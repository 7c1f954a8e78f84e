"""How long each notebook takes in a room, from what it holds and how long it ran: the workshop agenda's arithmetic.

    python tools/agenda.py                       # the table, from data/agenda.json's measured run times
    python tools/agenda.py --summary build/summary.json --write   # re-time from a run, rewrite docs/instructor.md's table
    python tools/agenda.py --summary build/summary.json --merge --write   # a run of some notebooks: re-time those only
    python tools/agenda.py --summary build/summary.json --update  # what `make run` does: --merge --write when the run
                                                  # is quick, passed and ran on data/agenda.json's machine; else say why

A notebook's room time is the sum of
- reading: its markdown words (presenter notes excluded) at ``WORDS_PER_MIN`` — technical prose read with care,
  an assumption stated as one, not a measurement of your room;
- code reading: the lines of its ``mechanism`` cells (the code the lesson is about) at ``CODE_LINES_PER_MIN``;
- predictions: ``PREDICT_MIN`` per ``PREDICT_…`` variable (ask, write it down, reveal);
- exercises: ``EXERCISE_MIN`` per exercise cell;
- machine time: its quick-mode wall time, measured (``data/agenda.json`` records the run: machine, date, command).

Each notebook's objectives slide states its time from ``data/agenda.json`` (``tools/nbbuild.py``); ``--update``
rebuilds the notebooks whose .ipynb is as built (a notebook a learner has edited is named, never overwritten).

The 3-hour agenda keeps the core notebooks in order while they fit between a break and the wrap-up; the rest are
homework. ``--write`` rewrites the table between the agenda markers in docs/instructor.md.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import nbbuild  # noqa: E402

WORDS_PER_MIN = 150  # careful reading of technical prose
CODE_LINES_PER_MIN = 10  # reading code that is the lesson
PREDICT_MIN = 1.5  # ask, write the number down, reveal
EXERCISE_MIN = 6  # one fill-in function and its check
SESSION_MIN = 180
BREAK_MIN = 10
WRAP_UP_MIN = 10
CORE = ("00_setup", "01_hardware_sizing", "02_fp16_bf16", "03_int8_int4", "05_kv_cache", "06_batching",
        "04_warmup", "03b_fp8_fp4", "07_vllm", "10_beyond", "08_tensorrt", "09_capstone", "11_scale_out",
        "12_serving_features")  # the 3-hour order of preference
TIMINGS = ROOT / "data" / "agenda.json"
DOC = ROOT / "docs" / "instructor.md"
START, END = "<!-- agenda:start (tools/agenda.py --write) -->", "<!-- agenda:end -->"


def content(src: Path) -> dict[str, Any]:
    """What a notebook source holds that takes a learner's time: words, mechanism lines, predictions, exercises."""
    cells = nbbuild.parse(src.read_text(encoding="utf-8"))
    words = sum(len(c.source.split()) for c in cells
                if c.cell_type == "markdown" and c.metadata["slideshow"]["slide_type"] != "notes")
    tags = [set(c.metadata.get("tags", [])) for c in cells]
    mech = sum(len([l for l in c.source.split("\n") if l.strip() and not l.strip().startswith("#")])
               for c, t in zip(cells, tags) if "mechanism" in t)
    predicts = len(set(re.findall(r"^(PREDICT_[A-Z0-9_]+)\s*=", src.read_text(encoding="utf-8"), re.M)))
    exercises = sum("exercise" in t for t in tags)
    return {"words": words, "mechanism_lines": mech, "predictions": predicts, "exercises": exercises}


def room_minutes(c: dict[str, Any], machine_s: float) -> dict[str, float]:
    parts = {"reading": c["words"] / WORDS_PER_MIN, "code": c["mechanism_lines"] / CODE_LINES_PER_MIN,
             "predictions": c["predictions"] * PREDICT_MIN, "exercises": c["exercises"] * EXERCISE_MIN,
             "machine": machine_s / 60}
    return {**parts, "total": sum(parts.values())}


def table(timings: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for src in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]*_*.py")):
        name = src.stem
        if name not in timings["wall_s"]:
            raise SystemExit(f"{TIMINGS}: no run time for {name}: re-time with --summary build/summary.json --write")
        c = content(src)
        rows.append({"notebook": name, **c, "machine_s": timings["wall_s"][name],
                     **{f"{k}_min": v for k, v in room_minutes(c, timings["wall_s"][name]).items()}})
    return rows


def plan(rows: list[dict[str, Any]], session_min: int = SESSION_MIN) -> tuple[list[dict[str, Any]], list[str]]:
    """The core notebooks in order while they fit (one break after the first half), rounded up to 5 minutes each."""
    by = {r["notebook"]: r for r in rows}
    left = session_min - BREAK_MIN - WRAP_UP_MIN
    kept, homework = [], []
    for name in CORE:
        need = 5 * math.ceil(by[name]["total_min"] / 5)
        if need <= left and len(homework) == 0:
            kept.append({"notebook": name, "minutes": need})
            left -= need
        else:
            homework.append(name)
    return kept, homework


def markdown(rows: list[dict[str, Any]], timings: dict[str, Any]) -> str:
    kept, homework = plan(rows)
    by = {r["notebook"]: r for r in rows}
    lines = [f"Machine times: quick mode on {timings['machine']} ({timings['date']}, `{timings['command']}`). Reading at "
             f"{WORDS_PER_MIN} words/min, code at {CODE_LINES_PER_MIN} lines/min, {PREDICT_MIN:g} min per prediction and "
             f"{EXERCISE_MIN} per exercise: assumptions, not measurements of your room (`python tools/agenda.py`).", "",
             "| time | notebook | minutes | reading | code | predictions | exercises | machine |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    t, half = 0, (SESSION_MIN - BREAK_MIN - WRAP_UP_MIN) / 2
    broke = False
    for k in kept:
        if not broke and t >= half:
            lines.append(f"| {t // 60}:{t % 60:02d} | break | {BREAK_MIN} | | | | | |")
            t, broke = t + BREAK_MIN, True
        r = by[k["notebook"]]
        lines.append(f"| {t // 60}:{t % 60:02d} | {k['notebook']} | {k['minutes']} | {r['reading_min']:.0f} | "
                     f"{r['code_min']:.0f} | {r['predictions']} ({r['predictions_min']:.0f}) | {r['exercises']} "
                     f"({r['exercises_min']:.0f}) | {r['machine_min']:.1f} |")
        t += k["minutes"]
    if not broke:
        lines.append(f"| {t // 60}:{t % 60:02d} | break | {BREAK_MIN} | | | | | |")
        t += BREAK_MIN
    lines.append(f"| {t // 60}:{t % 60:02d} | wrap-up: pack results, the class table | {WRAP_UP_MIN} | | | | | |")
    lines += ["", "Homework (each notebook's own time): " + ", ".join(
        f"{n} ({5 * math.ceil(by[n]['total_min'] / 5)} min)" for n in homework) + "."]
    return "\n".join(lines)


def timings_from(summary: Path) -> dict[str, Any]:
    s = json.loads(summary.read_text(encoding="utf-8"))
    if not s.get("quick"):
        raise SystemExit(f"{summary}: a full-mode run; the agenda is timed on quick mode (LABKIT_QUICK=1 make run)")
    bad = [n["name"] for n in s["notebooks"] if n["status"] != "ok"]
    if bad:
        raise SystemExit(f"{summary}: {bad} did not finish: re-time from a run where every notebook passed")
    sys.path.insert(0, str(ROOT))
    from labkit.core import cpu

    e = s.get("environment", {})
    hw = e.get("hardware") or {}
    return {"machine": cpu.machine_line(hw), "cores": hw.get("cpu_cores_logical"), "date": str(e.get("date", "?"))[:10],
            "command": "LABKIT_QUICK=1 python tools/run_notebooks.py", "wall_s": {n["name"]: n["wall_s"] for n in s["notebooks"]}}


def _machine(t: dict[str, Any]) -> tuple[Any, Any]:
    return t["machine"], t.get("cores")


def update(summary: Path) -> int:
    """``make run``'s step: re-time the notebooks of this run and rebuild the objectives slides that state them."""
    try:
        new = timings_from(summary)
    except SystemExit as exc:
        print(f"agenda: notebook times kept ({exc})")
        return 0
    saved = json.loads(TIMINGS.read_text(encoding="utf-8"))
    if _machine(saved) != _machine(new):
        print(f"agenda: notebook times kept: this run's machine ({new['machine']}, {new.get('cores')} cores) is not "
              f"{TIMINGS.name}'s ({saved['machine']}, {saved.get('cores')} cores); to time the lab on this machine "
              f"instead: python tools/agenda.py --summary {summary} --write (after a run of every notebook)")
        return 0
    unedited = [src for src in sorted((ROOT / "notebooks" / "src").glob("*.py"))
                if (ROOT / "notebooks" / f"{src.stem}.ipynb").read_text(encoding="utf-8") == nbbuild.dumps(nbbuild.build(src))]
    main(["--summary", str(summary), "--merge", "--write"])
    edited = sorted({p.stem for p in (ROOT / "notebooks" / "src").glob("*.py")} - {s.stem for s in unedited})
    for src in unedited:
        (ROOT / "notebooks" / f"{src.stem}.ipynb").write_text(nbbuild.dumps(nbbuild.build(src)), encoding="utf-8")
    print(f"agenda: re-timed {sorted(new['wall_s'])}; objectives slides rebuilt"
          + (f"; kept as you edited them: {edited} (python tools/nbbuild.py rebuilds them, replacing your edits)"
             if edited else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", type=Path, help="a quick run's build/summary.json: re-time from it")
    ap.add_argument("--merge", action="store_true", help="with --summary: keep the other notebooks' saved times "
                                                         "(the run must come from the same machine)")
    ap.add_argument("--write", action="store_true", help="save the timings and rewrite docs/instructor.md's table")
    ap.add_argument("--update", action="store_true", help="with --summary: --merge --write when the run can re-time "
                    "(quick, every notebook passed, data/agenda.json's machine), then rebuild the unedited notebooks; "
                    "otherwise keep the times and say why")
    args = ap.parse_args(argv)
    if args.update:
        if not args.summary:
            ap.error("--update re-times from a run: give it --summary build/summary.json")
        return update(args.summary)
    timings = timings_from(args.summary) if args.summary else json.loads(TIMINGS.read_text(encoding="utf-8"))
    if args.merge:
        if not args.summary:
            ap.error("--merge re-times the notebooks of one run: give it --summary build/summary.json")
        saved = json.loads(TIMINGS.read_text(encoding="utf-8"))
        if _machine(saved) != _machine(timings):
            raise SystemExit(f"{args.summary} ran on {timings['machine']}, {TIMINGS} on {saved['machine']}: "
                             "re-time every notebook from one run instead (no --merge)")
        timings = {**saved, "wall_s": {**saved["wall_s"], **timings["wall_s"]},
                   "note": f"re-timed {sorted(timings['wall_s'])} on {timings['date']}"}
    text = markdown(table(timings), timings)
    if args.write:
        TIMINGS.write_text(json.dumps(timings, indent=1) + "\n", encoding="utf-8")
        doc = DOC.read_text(encoding="utf-8")
        if START not in doc or END not in doc:
            raise SystemExit(f"{DOC}: no agenda markers ({START} … {END}) to write between")
        a, b = doc.index(START) + len(START), doc.index(END)
        DOC.write_text(doc[:a] + "\n" + text + "\n" + doc[b:], encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
