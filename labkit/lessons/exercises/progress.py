"""What a learner has done, kept on their own machine: each check's last verdict, hints asked, solutions shown,
predictions made.

One small JSON file, ``progress.json`` in the lab's cache (``LABKIT_CACHE``; ``LABKIT_PROGRESS`` names another file,
as the notebook runner does for its headless runs so they never touch a learner's record)::

    {"exercises": {"06.left_pad": {"status": "correct", "when": "2026-12-05T10:02:11", "checks": 3,
                                   "hints": 2, "solution": false}},
     "predictions": {"06_batching": {"total tokens/s at batch 8": {"predicted": 180.0, "when": "…"}}}}

Nothing here is sent anywhere; ``python -m tools.merge_results pack --progress`` carries it only when a learner
packs it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from ...core import config, results

_NOTEBOOK: str | None = None  # the running notebook's stem, set by its first cell (labkit.platforms.setup)
LABELS = {"correct": "done", "wrong": "wrong", "not attempted": "not tried"}


def here(notebook: str) -> None:
    """Say which notebook is running, so its predictions are filed under it."""
    global _NOTEBOOK
    _NOTEBOOK = notebook


def path() -> Path:
    if os.environ.get("LABKIT_PROGRESS"):
        return Path(os.environ["LABKIT_PROGRESS"])
    return config.cache_dir() / "progress.json"


def load(file: Path | None = None) -> dict[str, Any]:
    """The record (empty when there is none yet). A file that is not this record's JSON is an error naming it."""
    file = file or path()
    if not file.is_file():
        return {"exercises": {}, "predictions": {}}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not JSON ({exc.msg}, line {exc.lineno}): move it aside and run the check again "
                         "(a new record starts)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} is not a progress record: move it aside and run the check again")
    data.setdefault("exercises", {})
    data.setdefault("predictions", {})
    return data


def _now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def _update(exercise_id: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Load the record, apply ``change`` to the exercise's entry, stamp it and write the record back (atomically)."""
    data = load()
    entry = data["exercises"].setdefault(exercise_id, {"status": "not attempted", "checks": 0, "hints": 0,
                                                       "solution": False})
    change(entry)
    entry["when"] = _now()
    results.write_json_atomic(path(), data)


def record_check(exercise_id: str, status: str) -> None:
    """A check ran: keep its verdict (the last one counts) and count it."""
    _update(exercise_id, lambda e: e.update(status=status, checks=e.get("checks", 0) + 1))


def hints_seen(exercise_id: str) -> int:
    return int(load()["exercises"].get(exercise_id, {}).get("hints", 0))


def record_hint(exercise_id: str, number: int) -> None:
    """Hint ``number`` was shown: the record keeps the furthest one."""
    _update(exercise_id, lambda e: e.update(hints=max(number, int(e.get("hints", 0)))))


def record_solution(exercise_id: str) -> None:
    _update(exercise_id, lambda e: e.update(solution=True))


def record_prediction(what: str, predicted: Any) -> None:
    """A reveal ran in the current notebook: keep whether a prediction was made (nothing when no notebook is set)."""
    if _NOTEBOOK is None:
        return
    data = load()
    data["predictions"].setdefault(_NOTEBOOK, {})[what] = {"predicted": predicted, "when": _now()}
    results.write_json_atomic(path(), data)


def forget(exercise_id: str) -> bool:
    """Drop an exercise's record (its verdict, hints and solution shown); True when there was one."""
    data = load()
    had = data["exercises"].pop(exercise_id, None) is not None
    if had:
        results.write_json_atomic(path(), data)
    return had


def table(exercise_ids: Iterable[str], data: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per notebook: each exercise as done / wrong / not tried (with hints asked and a solution shown),
    and the predictions made among those revealed."""
    data = data if data is not None else load()
    rows: dict[str, dict[str, Any]] = {}
    for ex_id in exercise_ids:
        nb = ex_id[:2]
        row = rows.setdefault(nb, {"notebook": nb, "exercises": [], "done": 0, "total": 0})
        entry = data["exercises"].get(ex_id, {})
        status = LABELS[entry.get("status", "not attempted")]
        row["exercises"].append({"id": ex_id, "status": status, "hints": entry.get("hints", 0),
                                 "solution": bool(entry.get("solution"))})
        row["total"] += 1
        row["done"] += status == "done"
    for stem, made in data["predictions"].items():
        row = rows.setdefault(stem[:2], {"notebook": stem[:2], "exercises": [], "done": 0, "total": 0})
        row["predictions_made"] = row.get("predictions_made", 0) + sum(p["predicted"] is not None
                                                                        for p in made.values())
        row["predictions_revealed"] = row.get("predictions_revealed", 0) + len(made)
    return [rows[k] for k in sorted(rows)]


def text(rows: list[dict[str, Any]], where: Path | None = None) -> str:
    """The table as lines a notebook cell or a terminal prints."""
    done = sum(r["done"] for r in rows)
    total = sum(r["total"] for r in rows)
    made = sum(r.get("predictions_made", 0) for r in rows)
    lines = [f"Progress ({config.shown(where or path())}): {done} of {total} exercises done, {made} predictions made",
             f"{'nb':<3} {'predictions':<26} exercises"]
    for r in rows:
        said = (f"{r['predictions_made']} made of {r['predictions_revealed']} revealed"
                if "predictions_revealed" in r else "none revealed yet")
        shown = " · ".join(_cell(e) for e in r["exercises"]) or "(no exercises)"
        lines.append(f"{r['notebook']:<3} {said:<26} {shown}")
    return "\n".join(lines)


def _cell(e: dict[str, Any]) -> str:
    extra = [f"{e['hints']} hint{'s' if e['hints'] != 1 else ''}"] if e["hints"] else []
    extra += ["solution shown"] if e["solution"] else []
    return f"{e['id'][3:]} {e['status']}" + (f" ({', '.join(extra)})" if extra else "")
