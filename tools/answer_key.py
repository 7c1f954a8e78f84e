"""The instructor's answer key: the range of each notebook's headline figure by CPU class, from recorded runs, so a
learner's number can be read in the room as expected, noisy or broken.

    python -m tools.answer_key add results/          # add a run's headlines (each notebook's notes["headline"])
    python -m tools.answer_key                       # print the key (docs/answer_key.md is this, written by --write)
    python -m tools.answer_key check results/        # a learner's headlines against the key for their CPU class

A run's headlines are grouped by notebook, the headline's label, the CPU class (``cpu.isa_class``: AVX2, AVX-512,
Apple silicon, Arm, GPU) and the mode (quick or full): figures of different classes or modes are never pooled.
``check`` says "as expected" inside the recorded range, "off the range, within OFF_BY×" (noise: rerun on a quiet
machine) and "more than OFF_BY× off" (the machine differs, was busy, or something is broken: read its provenance).
A class with no recorded run says so: add one from a laptop of that class before the room meets.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from labkit.core import cpu, results

KEY = ROOT / "data" / "answer_key.json"
DOC = ROOT / "docs" / "answer_key.md"
CLASSES = ("AVX2", "AVX-512", "Apple silicon", "Arm", "GPU")
OFF_BY = results.OFF_BY


def headlines(results_dir: Path) -> list[dict[str, Any]]:
    """One record per results file in ``results_dir`` that saved a headline."""
    out = []
    for p in sorted(Path(results_dir).glob("[0-9][0-9]*_*.json")):
        res = results.load(p)
        head = res.notes.get("headline")
        if not head or not isinstance(head.get("value"), (int, float)):
            continue
        hw = res.env.get("hardware") or {}
        out.append({"notebook": res.name, "label": head["label"], "value": float(head["value"]),
                    "verdict": head.get("verdict"), "class": cpu.isa_class(hw), "machine": cpu.machine_line(hw),
                    "mode": "quick" if res.env.get("quick") else "full", "date": str(res.env.get("date", "?"))[:10]})
    return out


def load_key(path: Path = KEY) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["runs"] if path.is_file() else []


def ranges(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """(notebook, label, class, mode) → n, min, median, max and the machines the runs came from."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["notebook"], r["label"], r["class"], r["mode"]), []).append(r)
    return {k: {"n": len(v), "min": min(r["value"] for r in v), "median": statistics.median(r["value"] for r in v),
                "max": max(r["value"] for r in v), "machines": sorted({r["machine"] for r in v})}
            for k, v in groups.items()}


def judge(value: float, rng: dict[str, Any] | None) -> str:
    """A learner's headline against its class's range: the sentence the room reads."""
    if rng is None:
        return "no recorded run of this class and mode: nothing to compare with (add one: tools/answer_key.py add)"
    lo, hi = rng["min"], rng["max"]
    span = f"{lo:.3g}–{hi:.3g} over {rng['n']} run{'s' * (rng['n'] != 1)}"
    if lo <= value <= hi:
        return f"as expected ({span})"
    if lo / OFF_BY <= value <= hi * OFF_BY:
        return f"off the range ({span}) but within {OFF_BY:g}×: noise — rerun on a quiet machine"
    return (f"more than {OFF_BY:g}× off the range ({span}): the machine differs, was busy, or something is broken — "
            "read the notebook's provenance and load lines")


def markdown(runs: list[dict[str, Any]]) -> str:
    rng = ranges(runs)
    notebooks = sorted({k[0] for k in rng})
    lines = ["# Answer key: each notebook's headline by CPU class", "",
             "The range of each notebook's headline figure over recorded runs, by CPU class and mode "
             "(`python -m tools.answer_key`; add a run with `python -m tools.answer_key add results/`). In the room, "
             "`python -m tools.answer_key check results/` reads a learner's figures against their class: inside the "
             f"range is expected; off it but within {OFF_BY:g}× is noise (rerun on a quiet machine); further is a "
             "different or busy machine, or a fault.", ""]
    missing = [c for c in CLASSES if not any(k[2] == c for k in rng)]
    if missing:
        lines += ["No run recorded yet for: " + ", ".join(missing) + ". Before the room meets, run `LABKIT_QUICK=1 "
                  "make run` on one laptop of each class the room has and add it.", ""]
    lines += ["| notebook | headline | class | mode | runs | min | median | max | machines |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for nb in notebooks:
        for (n, label, cls, mode), r in sorted((k, v) for k, v in rng.items() if k[0] == nb):
            lines.append(f"| {n} | {label} | {cls} | {mode} | {r['n']} | {r['min']:.3g} | {r['median']:.3g} | "
                         f"{r['max']:.3g} | {'; '.join(r['machines'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    a = sub.add_parser("add", help="add a results folder's headlines to data/answer_key.json")
    a.add_argument("results_dir", type=Path)
    c = sub.add_parser("check", help="a learner's headlines against the key")
    c.add_argument("results_dir", type=Path)
    ap.add_argument("--write", action="store_true", help="rewrite docs/answer_key.md")
    args = ap.parse_args(argv)
    runs = load_key()
    if args.cmd in ("add", "check") and not args.results_dir.is_dir():
        ap.error(f"{args.results_dir}: no such folder (a results folder, e.g. results/)")
    if args.cmd == "add":
        found = headlines(args.results_dir)
        new = [h for h in found if h["class"] != "ISA not recorded"]  # older files: no class to file them under
        if len(new) < len(found):
            print(f"skipped {len(found) - len(new)} file(s) saved before results recorded the CPU's instruction sets")
        if not new:
            ap.error(f"{args.results_dir}: no results file with a headline (run the notebooks first)")
        KEY.write_text(json.dumps({"runs": runs + new}, indent=1) + "\n", encoding="utf-8")
        print(f"added {len(new)} headlines from {args.results_dir} ({new[0]['class']}, {new[0]['mode']} mode)")
        return 0
    if args.cmd == "check":
        rng = ranges(runs)
        for h in headlines(args.results_dir):
            print(f"{h['notebook']}: {h['label']} = {h['value']:.3g} ({h['class']}, {h['mode']}): "
                  + judge(h["value"], rng.get((h["notebook"], h["label"], h["class"], h["mode"]))))
        return 0
    text = markdown(runs)
    if args.write:
        DOC.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
