"""Results with provenance: rows of measurements plus the environment that produced them.

A notebook keeps one ``Results`` object, adds rows as it measures, and saves it to
``results/<name>.json`` atomically: a re-run replaces its own file and nothing else.
Reference files in ``data/reference/`` use the same format.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config, cpu, env, machine, verdict

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-.")


def jsonable(value: Any) -> Any:
    """Plain JSON values: dataclasses via to_dict, numpy/torch scalars via item(), NaN as None."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return jsonable(value.to_dict())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return jsonable(value.item())
    if isinstance(value, Path):
        return str(value)
    return value


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write JSON to a temporary file beside ``path`` and rename it over: never a half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(jsonable(data), fh, indent=2, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@dataclass
class Results:
    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not set(self.name.lower()) <= _NAME_CHARS:
            raise ValueError(f"results name {self.name!r}: use letters, digits, '_', '-' or '.' (e.g. '01_hardware_sizing')")

    def add(self, section: str, **values: Any) -> dict[str, Any]:
        """Add one row (``section`` groups rows, e.g. 'decode'); returns it as stored."""
        row = {"section": section, **jsonable(values)}
        self.rows.append(row)
        return row

    def replace(self, section: str, rows: list[dict[str, Any]]) -> None:
        """Drop a section's rows and put these in their place (re-running a cell)."""
        self.rows = [r for r in self.rows if r.get("section") != section]
        for r in rows:
            self.add(section, **r)

    def section(self, section: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("section") == section]

    def frame(self, section: str | None = None):
        import pandas as pd

        rows = self.rows if section is None else self.section(section)
        df = pd.DataFrame(rows)
        if section is not None and "section" in df:
            df = df.drop(columns=["section"])
        return df

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "env": self.env, "notes": self.notes, "rows": self.rows}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Results":
        """A results file's contents, checked: a ``ValueError`` says what is not in the labkit format."""
        if not isinstance(data, dict):
            raise ValueError(f"not a labkit results file: expected a JSON object, got {type(data).__name__}")
        for key in ("name", "rows"):
            if key not in data:
                raise ValueError(f"not a labkit results file: key {key!r} missing")
        if not isinstance(data["name"], str):
            raise ValueError(f"not a labkit results file: 'name' is {type(data['name']).__name__}, not text")
        if not isinstance(data["rows"], list) or not all(isinstance(r, dict) for r in data["rows"]):
            raise ValueError("not a labkit results file: 'rows' must be a list of objects")
        for key in ("env", "notes"):
            if not isinstance(data.get(key, {}), dict):
                raise ValueError(f"not a labkit results file: '{key}' must be an object")
        return cls(name=data["name"], rows=list(data["rows"]), env=dict(data.get("env", {})),
                   notes=dict(data.get("notes", {})))

    def save(self, path: str | Path | None = None) -> Path:
        """Save with the environment captured now; default ``results/<name>.json``."""
        if not self.env:
            self.env = env.environment()
        return write_json_atomic(path or default_path(self.name), self.to_dict())


def default_path(name: str) -> Path:
    return config.results_dir() / f"{name}.json"


def load(path_or_name: str | Path) -> Results:
    """Load a results file by path, or by name from the results directory."""
    path = Path(path_or_name)
    if not path.suffix:
        path = default_path(str(path_or_name))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results file there; run its notebook first (or `make run`)")
    return Results.from_dict(json.loads(path.read_text(encoding="utf-8")))


HERE = "this run"  # a row's ``where`` when the run that shows it measured it
REFERENCE = "reference"  # how a reference row's ``where`` begins: "reference: <its machine>, <its date>"


def where_of(res: "Results") -> str:
    """The ``where`` of a row a reference measured: "reference: AMD EPYC (avx2 fma), 2 cores, 2026-12-05", its machine
    and date, never "this run" (it was that run, not the one showing it)."""
    hw = res.env.get("hardware") or {}
    cores = f", {hw['cpu_cores_logical']} cores" if hw.get("cpu_cores_logical") and not hw.get("gpu") else ""
    return f"{REFERENCE}: {cpu.machine_line(hw)}{cores}, {str(res.env.get('date') or 'date not recorded')[:10]}"


def is_reference(where: Any) -> bool:
    """Whether a row's ``where`` says a reference measured it (``where_of``, or the bare word of older files)."""
    return str(where).startswith(REFERENCE)


def as_reference(res: "Results") -> "Results":
    """``res`` as a reference stores it: every row's ``where`` that said ``HERE`` names the machine instead
    (``where_of``), so no stored row says "this run" of a run that is not the reader's. In place; returns ``res``."""
    mine = where_of(res)
    for row in res.rows:
        if row.get("where") == HERE:
            row["where"] = mine
    return res


def reference_dir() -> Path:
    return config.DATA_DIR / "reference"


def reference(name: str) -> Results:
    """A reference result from data/reference/ (measured elsewhere, with its provenance)."""
    path = reference_dir() / f"{name}.json"
    if not path.is_file():
        have = sorted(p.stem for p in reference_dir().glob("*.json"))
        raise FileNotFoundError(f"no reference result {name!r}; available: {have}")
    return Results.from_dict(json.loads(path.read_text(encoding="utf-8")))


def reference_name(name: str, env: dict[str, Any]) -> str:
    """The file stem a reference result is stored under: ``name`` for a CPU run, ``name.<gpu>`` for a GPU
    run (``07_vllm.nvidia-h200``), so GPU and CPU references of one notebook live side by side."""
    gpu = (env.get("hardware") or {}).get("gpu")
    if env.get("device", "cpu") == "cpu" or not gpu:
        return name
    return f"{name}.{re.sub(r'[^a-z0-9]+', '-', str(gpu).lower()).strip('-')}"


def gpu_references(name: str) -> list[Results]:
    """Every GPU reference result of notebook ``name`` (files ``name.<gpu>.json``), by file name."""
    return [Results.from_dict(json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(reference_dir().glob(f"{name}.*.json"))]


SPREADS = ("decode_spread", "tpot_spread", "spread")  # the columns a timed row keeps its (p90 − p10) / median in


def with_doubts(df):
    """``df`` with a ``doubts`` column where it has a spread or a drift (``verdict.doubts``: a spread over a quarter
    of the median, a baseline that drifted): a stored row is as rough as it was when measured, wherever it is shown."""
    spread = next((c for c in SPREADS if c in df.columns), None)
    if spread is None and "drift" not in df.columns:
        return df
    df = df.copy()
    df["doubts"] = ["; ".join(verdict.doubts(r.get(spread) if spread else None, r.get("drift")))
                    for r in df.to_dict("records")]
    return df


def compact(df):
    """``df`` without the columns a reader cannot scan in a table: those holding lists or dicts (samples, answers,
    per-prompt values) and the long explanations (``*_source``, ``note``). The JSON keeps them all."""
    def bulky(col: str) -> bool:
        return (col.endswith("_source") or col == "note"
                or bool(df[col].map(lambda v: isinstance(v, (list, dict, tuple))).any()))
    return df[[c for c in df.columns if not bulky(c)]]


def provenance(res: Results) -> str:
    """One line saying where and when a result was measured."""
    e = res.env
    hw = e.get("hardware", {})
    where = cpu.machine_line(hw)
    v = e.get("versions", {})
    return (f"{res.name}: measured {e.get('date', '?')} on {where} ({e.get('device', '?')}), "
            f"torch {v.get('torch', '?')}, transformers {v.get('transformers', '?')}; "
            f"command: {e.get('command', '?')}")


def section_provenance(res: Results, section: str) -> str:
    """``provenance`` of the run a section came from: a reference can hold sections of a later run, each with
    its own environment under ``notes["section_env"]`` (``python -m tools.run_notebooks --reference --sections``)."""
    own = (res.notes.get("section_env") or {}).get(section)
    return provenance(Results(res.name, env=own)) if own else provenance(res)


def mode(res: Results) -> str:
    """What a result's numbers may be compared with: 'quick' or 'full', and the token counts its notebook
    recorded (``notes["tokens"]``). Figures of different modes never share one axis."""
    label = "quick" if res.env.get("quick") else "full"
    tokens = res.notes.get("tokens")
    return f"{label}, {tokens}" if tokens else label


OFF_BY = 2.0  # a ratio more than 2× away from the quiet reference's says the machine differs or was busy


def beside_reference(what: str, value: float, ref: Results | None, ref_value: float | None, unit: str = "×") -> str:
    """This run's ``value`` printed beside the shipped reference's, with a warning when they are > OFF_BY apart.

    Ratios (× one's own baseline) are compared across modes: each side is normalised to its own machine and run.
    """
    if ref is None or ref_value is None or not ref_value or not value:
        return f"{what}: {value:.2f}{unit} here (no reference of it ships)"
    mode = "quick" if ref.env.get("quick") else "full"
    line = (f"{what}: {value:.2f}{unit} here ({cpu.machine_line(env.hardware())}), "
            f"{ref_value:.2f}{unit} in the reference ({mode} mode, {cpu.machine_line(ref.env.get('hardware') or {})})")
    off = max(value / ref_value, ref_value / value)
    if off > OFF_BY:
        line += (f". {off:.1f}× off the reference: your machine differs or was busy. {machine.last_line()}")
    return line
