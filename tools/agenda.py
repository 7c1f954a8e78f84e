"""How long each notebook takes in a room, from what it holds and how long it ran: the workshop agenda's arithmetic.

    python -m tools.agenda                       # the table, from data/agenda.json's measured run times
    python -m tools.agenda --summary build/summary.json --write   # re-time from a run, rewrite docs/instructor.md's table
    python -m tools.agenda --summary build/summary.json --merge --write   # a run of some notebooks: re-time those only
    python -m tools.nbbuild --retime build/summary.json  # what `make run` does: --merge --write when the run is
                                                  # quick, passed and ran on data/agenda.json's machine, then rebuild

A notebook's room time is the sum of
- reading: its markdown words (presenter notes excluded) at ``WORDS_PER_MIN`` — technical prose read with care,
  an assumption stated as one, not a measurement of your room;
- printed output: the words its quick run printed (tables' and lines' text, charts left out, counted by
  tools/run_notebooks.py) at ``OUTPUT_WORDS_PER_MIN``, a faster read;
- code reading: the lines of its ``mechanism`` cells (the code the lesson is about) at ``CODE_LINES_PER_MIN``;
- predictions: ``PREDICT_MIN`` per ``PREDICT_…`` variable (ask, write it down, reveal);
- exercises: ``EXERCISE_MIN`` per exercise cell;
- machine time: its quick-mode wall time, measured (``data/agenda.json`` records the run: machine, date, command);
then ``SLACK`` on top (questions, a slow laptop in the room), and rounded up to 5 minutes.

Each notebook's objectives slide states its time from ``data/agenda.json`` (``tools.nbbuild``); its ``--retime``
rebuilds the notebooks whose .ipynb is as built (a notebook a learner has edited is named, never overwritten).

The 3-hour agenda keeps the core notebooks in order while they fit between a break and the wrap-up; the rest are
homework. The 1-day agenda (09:00 to 17:30, two breaks and lunch) keeps ``DAY``'s order while notebooks fit; the rest
are a second day or homework. ``--write`` rewrites both tables between their markers in docs/instructor.md, and the README's notebook table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from labkit.core import cpu
from tools import cells

WORDS_PER_MIN = 150  # careful reading of technical prose
OUTPUT_WORDS_PER_MIN = 200  # printed results: sentences and tables, read faster than the prose around them
SLACK = 0.12  # on top of every notebook's sum: questions, a laptop slower than the timed machine
CODE_LINES_PER_MIN = 10  # reading code that is the lesson
PREDICT_MIN = 1.5  # ask, write the number down, reveal
EXERCISE_MIN = 6  # one fill-in function and its check
SESSION_MIN = 180
BREAK_MIN = 10
WRAP_UP_MIN = 10
CORE = ("00_setup", "01_hardware_sizing", "02_fp16_bf16", "03_int8_int4", "05_kv_cache", "06_batching",
        "04_warmup", "03b_fp8_fp4", "07_vllm", "10_beyond", "08_tensorrt", "09_capstone", "11_scale_out",
        "12_serving_features", "13_agents", "14_trust")  # the 3-hour order of preference
TIMINGS = ROOT / "data" / "agenda.json"
DOC = ROOT / "docs" / "instructor.md"
START, END = "<!-- agenda:start (tools/agenda.py --write) -->", "<!-- agenda:end -->"
DAY_START, DAY_END = "<!-- day:start (tools/agenda.py --write) -->", "<!-- day:end -->"
README = ROOT / "README.md"
TABLE_START, TABLE_END = "<!-- notebooks:start (python -m tools.agenda --write) -->", "<!-- notebooks:end -->"
DAY = ("00_setup", "01_hardware_sizing", "02_fp16_bf16", "03_int8_int4", "03b_fp8_fp4", "05_kv_cache", "06_batching",
       "07_vllm", "12_serving_features", "04_warmup", "10_beyond", "08_tensorrt", "09_capstone",
       "11_scale_out", "13_agents", "14_trust")  # the 1-day order of preference
DAY_OPEN_MIN, DAY_CLOSE_MIN = 9 * 60, 17 * 60 + 30  # 09:00 to 17:30
DAY_BREAKS = ((10 * 60 + 30, "break", 15), (12 * 60 + 15, "lunch", 60), (15 * 60, "break", 15))  # once reached
FOCUS = {
    "00_setup": "install check, capabilities, first measured answer; how results files are saved",
    "01_hardware_sizing": "sizing model, roofline ceiling, measured bandwidth; sizing panel exercises",
    "02_fp16_bf16": "precision vs bytes vs speed vs quality",
    "03_int8_int4": "bitsandbytes int8/nf4, ONNX Runtime dynamic int8, the per-channel lesson",
    "03b_fp8_fp4": "E4M3 by hand, NVFP4 against MXFP4, FP8 GEMMs here beside a GPU's",
    "04_warmup": "cold start vs warm, what the first call pays, why benchmarks exclude warmup",
    "05_kv_cache": "KV bytes, cache vs no cache, attention implementations",
    "06_batching": "static sweep, padding, dynamic batching server, load tests; live panel",
    "07_vllm": "paged KV and continuous batching, then vLLM's engine on every laptop (`make vllm`)",
    "08_tensorrt": "fusion, torch.compile, ONNX Runtime's levels, calibration; TensorRT on GPU machines",
    "09_capstone": "each learner picks the best configuration for an SLO on their machine; merge and discuss",
    "10_beyond": "prompt-lookup decoding, prefix caching, chunked prefill, a quantised KV cache, llama.cpp",
    "11_scale_out": "replicas behind a router, the knee under an SLO, cost and energy per token",
    "12_serving_features": "structured outputs, LoRA adapters, prefill/decode split",
    "13_agents": "an agent trace's prefix-cache economics, cache-busters, a disk tier for KV, tool calls",
    "14_trust": "four benchmark clients on one server under one definition, A/A and A/B, MLPerf LoadGen, batch-dependent answers",
}
DAY_WRAP_MIN = 15  # the day's last slot: pack results, the class table


def content(src: Path) -> dict[str, Any]:
    """What a notebook source holds that takes a learner's time: words, mechanism lines, predictions, exercises."""
    parsed = cells.parse(src.read_text(encoding="utf-8"))
    words = sum(len(c.source.split()) for c in parsed
                if c.cell_type == "markdown" and c.metadata["slideshow"]["slide_type"] != "notes")
    tags = [set(c.metadata.get("tags", [])) for c in parsed]
    mech = sum(len([l for l in c.source.split("\n") if l.strip() and not l.strip().startswith("#")])
               for c, t in zip(parsed, tags) if "mechanism" in t)
    predicts = len(set(re.findall(r"^(PREDICT_[A-Z0-9_]+)\s*=", src.read_text(encoding="utf-8"), re.M)))
    exercises = sum("exercise" in t for t in tags)
    return {"words": words, "mechanism_lines": mech, "predictions": predicts, "exercises": exercises}


def room_minutes(c: dict[str, Any], machine_s: float, output_words: int = 0) -> dict[str, float]:
    parts = {"reading": c["words"] / WORDS_PER_MIN, "output": output_words / OUTPUT_WORDS_PER_MIN,
             "code": c["mechanism_lines"] / CODE_LINES_PER_MIN, "predictions": c["predictions"] * PREDICT_MIN,
             "exercises": c["exercises"] * EXERCISE_MIN, "machine": machine_s / 60}
    return {**parts, "total": sum(parts.values()) * (1 + SLACK)}


def slot(minutes: float) -> int:
    """A notebook's minutes in an agenda: rounded up to 5."""
    return 5 * math.ceil(minutes / 5)


def table(timings: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for src in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]*_*.py")):
        name = src.stem
        if name not in timings["wall_s"]:
            raise SystemExit(f"{TIMINGS}: no run time for {name}: re-time with --summary build/summary.json --write")
        c = content(src)
        words = (timings.get("output_words") or {}).get(name)
        if words is None:
            raise SystemExit(f"{TIMINGS}: no printed-output count for {name}: re-time with --summary build/summary.json "
                             "--write after a run of every notebook")
        rows.append({"notebook": name, **c, "output_words": words, "machine_s": timings["wall_s"][name],
                     **{f"{k}_min": v for k, v in room_minutes(c, timings["wall_s"][name], words).items()}})
    return rows


def plan(rows: list[dict[str, Any]], session_min: int = SESSION_MIN) -> tuple[list[dict[str, Any]], list[str]]:
    """The core notebooks in order while they fit (one break after the first half), rounded up to 5 minutes each."""
    by = {r["notebook"]: r for r in rows}
    left = session_min - BREAK_MIN - WRAP_UP_MIN
    kept, homework = [], []
    for name in CORE:
        need = slot(by[name]["total_min"])
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
             f"{WORDS_PER_MIN} words/min, printed output at {OUTPUT_WORDS_PER_MIN}, code at {CODE_LINES_PER_MIN} lines/min, "
             f"{PREDICT_MIN:g} min per prediction and {EXERCISE_MIN} per exercise, then {SLACK:.0%} slack: assumptions, "
             "not measurements of your room (`python -m tools.agenda`).", "",
             "| time | notebook | minutes | reading | printed | code | predictions | exercises | machine |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    t, half = 0, (SESSION_MIN - BREAK_MIN - WRAP_UP_MIN) / 2
    broke = False
    for k in kept:
        if not broke and t >= half:
            lines.append(f"| {t // 60}:{t % 60:02d} | break | {BREAK_MIN} | | | | | | |")
            t, broke = t + BREAK_MIN, True
        r = by[k["notebook"]]
        lines.append(f"| {t // 60}:{t % 60:02d} | {k['notebook']} | {k['minutes']} | {r['reading_min']:.0f} | "
                     f"{r['output_min']:.0f} | {r['code_min']:.0f} | {r['predictions']} ({r['predictions_min']:.0f}) | "
                     f"{r['exercises']} ({r['exercises_min']:.0f}) | {r['machine_min']:.1f} |")
        t += k["minutes"]
    if not broke:
        lines.append(f"| {t // 60}:{t % 60:02d} | break | {BREAK_MIN} | | | | | | |")
        t += BREAK_MIN
    lines.append(f"| {t // 60}:{t % 60:02d} | wrap-up: pack results, the class table | {WRAP_UP_MIN} | | | | | | |")
    lines += ["", "Homework (each notebook's own time): " + ", ".join(
        f"{n} ({slot(by[n]['total_min'])} min)" for n in homework) + "."]
    return "\n".join(lines)


def day_plan(rows: list[dict[str, Any]]) -> tuple[list[tuple[int, str, int]], list[str]]:
    """The 1-day agenda: (start minute, notebook or break, minutes) in ``DAY``'s order while each notebook ends before
    the wrap-up, each break or lunch once its time is reached; and the notebooks left for a second day."""
    by = {r["notebook"]: r for r in rows}
    slots: list[tuple[int, str, int]] = []
    t, left, breaks = DAY_OPEN_MIN, [], list(DAY_BREAKS)
    for name in DAY:
        while breaks and t >= breaks[0][0]:
            _, what, minutes = breaks.pop(0)
            slots.append((t, what, minutes))
            t += minutes
        need = slot(by[name]["total_min"])
        if left or t + need > DAY_CLOSE_MIN - DAY_WRAP_MIN:
            left.append(name)
            continue
        slots.append((t, name, need))
        t += need
    for _, what, minutes in breaks:
        if t + minutes <= DAY_CLOSE_MIN - DAY_WRAP_MIN:
            slots.append((t, what, minutes))
            t += minutes
    slots.append((t, "wrap-up: pack results, the class table", DAY_WRAP_MIN))
    return slots, left


def day_markdown(rows: list[dict[str, Any]]) -> str:
    slots, left = day_plan(rows)
    lines = ["| time | notebook | minutes | focus |", "| --- | --- | --- | --- |"]
    for t, what, minutes in slots:
        lines.append(f"| {t // 60:02d}:{t % 60:02d} | {what} | {minutes} | {FOCUS.get(what, '')} |")
    end = slots[-1][0] + slots[-1][2]
    lines.append(f"| {end // 60:02d}:{end % 60:02d} | end | | |")
    if left:
        by = {r["notebook"]: r for r in rows}
        lines += ["", "A second day, or homework: " + ", ".join(
            f"{n} ({slot(by[n]['total_min'])} min)" for n in left) + "."]
    return "\n".join(lines)


def _first(src: Path, prefix: str) -> str:
    """The first markdown line of a source starting with ``prefix``, with the indented lines that continue it (a
    list item), its links' targets dropped."""
    for cell in cells.parse(src.read_text(encoding="utf-8")):
        if cell.cell_type == "markdown":
            lines = cell.source.splitlines()
            for i, line in enumerate(lines):
                if line.startswith(prefix):
                    more = [ln.strip() for ln in itertools.takewhile(lambda ln: ln.startswith("  "), lines[i + 1:])]
                    text = re.split(r"(?<=\.) ", " ".join([line[len(prefix):].strip(), *more]))[0]  # its first sentence
                    return re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    raise SystemExit(f"{src.name}: no markdown line starting {prefix!r}")


def readme_table(rows: list[dict[str, Any]]) -> str:
    """The README's notebook table: each notebook's title and first learning objective, from its source; its
    quick-mode compute and room time, from ``data/agenda.json`` and the counts above."""
    lines = ["| notebook | what you do and measure | compute, quick mode | in the room |", "| --- | --- | --- | --- |"]
    for r in rows:
        src = ROOT / "notebooks" / "src" / f"{r['notebook']}.py"
        lines.append(f"| [{_first(src, '# ')}](notebooks/{r['notebook']}.ipynb) | {_first(src, '- ')} "
                     f"| {r['machine_s'] / 60:.1f} min | about {slot(r['total_min'])} min |")
    room = sum(slot(r["total_min"]) for r in rows)
    lines.append(f"| all {len(rows)} | | {sum(r['machine_s'] for r in rows) / 60:.0f} min | about {room / 60:.1f} hours |")
    return "\n".join(lines)


def timings_from(summary: Path) -> dict[str, Any]:
    s = json.loads(summary.read_text(encoding="utf-8"))
    if not s.get("quick"):
        raise SystemExit(f"{summary}: a full-mode run; the agenda is timed on quick mode (LABKIT_QUICK=1 make run)")
    bad = [n["name"] for n in s["notebooks"] if n["status"] != "ok"]
    if bad:
        raise SystemExit(f"{summary}: {bad} did not finish: re-time from a run where every notebook passed")
    e = s.get("environment", {})
    hw = e.get("hardware") or {}
    return {"machine": cpu.machine_line(hw), "cores": hw.get("cpu_cores_logical"), "date": str(e.get("date", "?"))[:10],
            "command": "LABKIT_QUICK=1 python -m tools.run_notebooks", "wall_s": {n["name"]: n["wall_s"] for n in s["notebooks"]},
            "output_words": {n["name"]: n.get("output_words") for n in s["notebooks"]}}


def _machine(t: dict[str, Any]) -> tuple[Any, Any]:
    return t["machine"], t.get("cores")


def retimed(summary: Path) -> list[str] | None:
    """Re-time the notebooks of a quick run (``--summary --merge --write``) when it can: quick mode, every notebook
    passed, ``data/agenda.json``'s machine; the notebooks re-timed, or None with the reason printed."""
    try:
        new = timings_from(summary)
    except SystemExit as exc:
        print(f"agenda: notebook times kept ({exc})")
        return None
    saved = json.loads(TIMINGS.read_text(encoding="utf-8"))
    if _machine(saved) != _machine(new):
        print(f"agenda: notebook times kept: this run's machine ({new['machine']}, {new.get('cores')} cores) is not "
              f"{TIMINGS.name}'s ({saved['machine']}, {saved.get('cores')} cores); to time the lab on this machine "
              f"instead: python -m tools.agenda --summary {summary} --write (after a run of every notebook)")
        return None
    main(["--summary", str(summary), "--merge", "--write"])
    return sorted(new["wall_s"])


def between(doc: str, start: str, end: str, body: str, path: Path) -> str:
    """``doc`` with ``body`` between its ``start`` and ``end`` markers."""
    if start not in doc or end not in doc:
        raise SystemExit(f"{path}: no markers ({start} … {end}) to write between")
    a, b = doc.index(start) + len(start), doc.index(end)
    return doc[:a] + "\n" + body + "\n" + doc[b:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", type=Path, help="a quick run's build/summary.json: re-time from it")
    ap.add_argument("--merge", action="store_true", help="with --summary: keep the other notebooks' saved times "
                                                         "(the run must come from the same machine)")
    ap.add_argument("--write", action="store_true", help="save the timings and rewrite docs/instructor.md's table")
    args = ap.parse_args(argv)
    timings = timings_from(args.summary) if args.summary else json.loads(TIMINGS.read_text(encoding="utf-8"))
    if args.merge:
        if not args.summary:
            ap.error("--merge re-times the notebooks of one run: give it --summary build/summary.json")
        saved = json.loads(TIMINGS.read_text(encoding="utf-8"))
        if _machine(saved) != _machine(timings):
            raise SystemExit(f"{args.summary} ran on {timings['machine']}, {TIMINGS} on {saved['machine']}: "
                             "re-time every notebook from one run instead (no --merge)")
        timings = {**saved, "wall_s": {**saved["wall_s"], **timings["wall_s"]},
                   "output_words": {**(saved.get("output_words") or {}), **timings["output_words"]},
                   "note": f"re-timed {sorted(timings['wall_s'])} on {timings['date']}"}
    rows = table(timings)
    text, day = markdown(rows, timings), day_markdown(rows)
    if args.write:
        TIMINGS.write_text(json.dumps(timings, indent=1) + "\n", encoding="utf-8")
        doc = DOC.read_text(encoding="utf-8")
        for start, end, body in ((START, END, text), (DAY_START, DAY_END, day)):
            doc = between(doc, start, end, body, DOC)
        DOC.write_text(doc, encoding="utf-8")
        README.write_text(between(README.read_text(encoding="utf-8"), TABLE_START, TABLE_END, readme_table(rows),
                                  README), encoding="utf-8")
    print(text + "\n\n" + day)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
