"""Published GPU figures: what vendors and projects printed, shown where no GPU of ours measured anything.

``data/published_gpu.json`` holds rows transcribed from benchmark tables and posts (TensorRT-LLM, TensorRT Model
Optimizer, vLLM), each with its source page, that page's date and what the date means, the model, the GPU, the
engine and its version, the precision and the workload. They are not measurements: labkit never ran them, and
nothing here puts them in a table beside a measured number. ``lessons.references.show`` shows a notebook's rows
(``source="published"``, or where no measured GPU reference of it ships) under a heading that says they are
published.

``load`` refuses a row without its provenance or with a figure that is not a positive number, naming the fix, so
no unsourced number reaches a notebook.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

from . import config
from .checks import load_rows, row_error

REQUIRED = ("id", "notebooks", "what", "model", "gpu", "engine", "engine_version", "precision", "figures", "units",
            "source", "date", "date_meaning", "where")
WORKLOAD_NUMBERS = ("batch_size", "concurrency", "input_tokens", "output_tokens", "tensor_parallel", "qps")
WORKLOAD_TEXT = ("dataset",)


def path() -> Path:
    return config.DATA_DIR / "published_gpu.json"


def _error(where: Path, i: int, row: Any, problem: str) -> ValueError:
    return row_error(where, i, row, problem, "id")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _check_text(row: dict[str, Any], key: str, fail) -> None:
    if not isinstance(row.get(key), str) or not row[key].strip():
        raise fail(f"{key}={row.get(key)!r}: give {key} as non-empty text (write 'not stated on the page' where "
                   "the source leaves it out)")


def _check_figures(row: dict[str, Any], fail) -> None:
    figures, units = row.get("figures"), row.get("units")
    if not isinstance(figures, dict) or not figures:
        raise fail("figures: an object of at least one published number, e.g. {\"tokens_per_s\": 245.03}")
    if not isinstance(units, dict):
        raise fail("units: an object giving each figure's unit, e.g. {\"tokens_per_s\": \"tokens/s\"}")
    for name, value in figures.items():
        if not _positive(value):
            raise fail(f"figures.{name}={value!r}: a positive number as the page prints it (leave a figure out "
                       "rather than estimate it)")
        if not isinstance(units.get(name), str) or not units[name].strip():
            raise fail(f"units.{name}: missing; add \"{name}\": \"<unit as the page states it>\" to units")
    extra = sorted(set(units) - set(figures))
    if extra:
        raise fail(f"units {extra} name no figure: remove them or add the figures")


def _check_workload(row: dict[str, Any], fail) -> None:
    workload = row.get("workload", {})
    if not isinstance(workload, dict):
        raise fail(f"workload: an object with any of {WORKLOAD_NUMBERS + WORKLOAD_TEXT}")
    for key, value in workload.items():
        if key in WORKLOAD_NUMBERS and not _positive(value):
            raise fail(f"workload.{key}={value!r}: a positive number, or leave it out where the page does not state it")
        if key in WORKLOAD_TEXT and (not isinstance(value, str) or not value.strip()):
            raise fail(f"workload.{key}: non-empty text")
        if key not in WORKLOAD_NUMBERS + WORKLOAD_TEXT:
            raise fail(f"workload.{key}: unknown; choose from {WORKLOAD_NUMBERS + WORKLOAD_TEXT}")


def check_row(row: Any, i: int = 0, where: Path | str = "published_gpu") -> dict[str, Any]:
    """One published row, validated: every field of ``REQUIRED``, notebooks as two-digit numbers, positive
    figures each with a unit, a positive GPU count, an http(s) source URL and an ISO date."""
    where = Path(where)

    def fail(problem: str) -> ValueError:
        return _error(where, i, row, problem)

    if not isinstance(row, dict):
        raise fail(f"expected an object with {REQUIRED}, got {type(row).__name__}")
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise fail(f"missing {missing}: every published row needs {REQUIRED}")
    for key in ("id", "what", "model", "gpu", "engine", "engine_version", "precision", "date_meaning", "where"):
        _check_text(row, key, fail)
    notebooks = row["notebooks"]
    if (not isinstance(notebooks, list) or not notebooks
            or not all(isinstance(n, str) and re.fullmatch(r"\d\d", n) for n in notebooks)):
        raise fail(f"notebooks={notebooks!r}: the notebooks this row serves, as two-digit numbers, "
                   "e.g. [\"02\", \"08\"]")
    if not _positive(row.get("gpus", 1)) or not isinstance(row.get("gpus", 1), int):
        raise fail(f"gpus={row.get('gpus')!r}: how many GPUs the figure was measured on, a positive integer")
    _check_figures(row, fail)
    _check_workload(row, fail)
    source = row["source"]
    if not isinstance(source, str) or not source.startswith(("https://", "http://")):
        raise fail(f"source={source!r}: the URL of the page the figures were read from (http:// or https://)")
    try:
        ok = isinstance(row["date"], str) and bool(dt.date.fromisoformat(row["date"]))
    except ValueError:
        ok = False
    if not ok:
        raise fail(f"date={row['date']!r}: the page's date as YYYY-MM-DD, and say in date_meaning what it is "
                   "(published, last changed …)")
    return row


def load(file: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows of ``data/published_gpu.json`` (or ``file``), each checked by ``check_row``; ids must be unique."""
    return load_rows(file if file is not None else path(), "rows", check_row, "id", "published GPU figures")


def for_notebook(number: str, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The published rows that serve notebook ``number`` ('02'), in file order."""
    return [r for r in (load() if rows is None else rows) if number in r["notebooks"]]
