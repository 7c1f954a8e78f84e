"""Every table a notebook shows from a reference, through one ``show(...)``: what cannot be measured here, shown as
measured elsewhere under the line saying where, when and how, or one line saying that none ships and how to make it.
``core.results`` and ``core.published`` load the files; this module only renders them.

``show(name, sections, columns, source=...)``, ``source`` one of ``SOURCES``:

``reference``  data/reference/<name>.json, the reference run a quick run here lacks (vLLM's rows, a full run's
               sections): each section's rows (those ``keep(row)`` accepts) under the provenance of the run it
               came from (``results.section_provenance``), with vLLM's version where the reference recorded it
``gpu``        every data/reference/<name>.<gpu>.json: each file under its provenance, its sections with their
               doubts (a spread, a drift) and without the columns a reader cannot scan; when none ships, the
               notebook's published figures after the line saying how to make one
``published``  data/published_gpu.json's rows for the notebook (``precision`` keeps the rows in those formats),
               under a heading saying they are published: never in a table beside a measurement
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core import config, published, results

SOURCES = ("reference", "gpu", "published")
HEADING = ("Published GPU figures (vendor and project benchmark pages; NOT measured here or by labkit, each setup "
           "differs: compare rows of one source with each other, not with this run):")
PUBLISHED_COLUMNS = ["what", "model", "gpu", "engine", "precision", "workload", "figures", "source", "date"]


def show(name: str, sections: str | Sequence[str] = (), columns: Sequence[str] | None = None, *,
         source: str = "reference", keep: Callable[[Mapping[str, Any]], bool] | None = None,
         precision: Sequence[str] = ()) -> int:
    """Show notebook ``name``'s tables from ``source`` (one of ``SOURCES``, see the module's note): ``sections``
    (one results section or several; none for ``published``), ``columns`` picking and ordering the columns shown
    (those a section lacks are skipped; None: every column a reader can scan). Returns how many rows were shown, 0
    when none ships (the published figures a ``gpu`` table falls back to are not counted). The one call a
    notebook's reference cell makes, e.g. ``show("07_vllm", "vllm", source="gpu")``."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: choose one of {SOURCES}")
    number = name.split("_")[0]
    if source == "published":
        return _published(number, precision)
    wanted = [sections] if isinstance(sections, str) else list(sections)
    if not wanted:
        raise ValueError("sections: name at least one results section, e.g. 'variants'")
    if source == "gpu":
        return _gpu(name, wanted, columns)
    return sum(_reference(name, section, columns, keep) for section in wanted)


def _display(frame: Any) -> None:
    try:
        from IPython.display import display
    except ImportError:
        display = print
    display(frame)


def _columns(frame: Any, columns: Sequence[str] | None) -> Any:
    return frame[[c for c in columns if c in frame.columns]] if columns else results.compact(frame)


def _reference(name: str, section: str, columns: Sequence[str] | None, keep: Any) -> int:
    import pandas as pd

    path = results.reference_dir() / f"{name}.json"
    ref = results.reference(name) if path.is_file() else None
    rows = [r for r in (ref.section(section) if ref else []) if keep is None or keep(r)]
    if not rows:
        print(f"No reference of it ships yet (data/reference/{name}.json, section {section!r})"
              + ("." if config.platform() in config.HOSTED else
                 f": `make vllm`, then `make reference NOTEBOOKS={name.split('_')[0]}`."))
        return 0
    vllm_version = (ref.notes.get("vllm") or {}).get("platform", {}).get("version")
    print("Reference, measured elsewhere:", results.section_provenance(ref, section)
          + (f"; vLLM {vllm_version}" if vllm_version else ""))
    _display(_columns(pd.DataFrame(rows), columns).round(3))
    return len(rows)


def _gpu(name: str, wanted: list[str], columns: Sequence[str] | None) -> int:
    refs = [r for r in results.gpu_references(name) if any(r.section(s) for s in wanted)]
    if not refs:
        print(f"No GPU reference of {name} ships yet: `make reference NOTEBOOKS={name.split('_')[0]}` on a GPU "
              f"machine writes data/reference/{name}.<gpu>.json, and this cell shows it.")
        _published(name.split("_")[0])
        return 0
    shown = 0
    for ref in refs:
        print("GPU reference (measured elsewhere, not in this run):", results.provenance(ref))
        for section in wanted:
            df = ref.frame(section)
            if df.empty:
                continue
            df = results.with_doubts(_columns(df, columns))
            if "where" in df.columns:  # a stored "this run" (older files) is the reference's run: name its machine
                df["where"] = [results.where_of(ref) if w in (results.HERE, results.REFERENCE) else w
                               for w in df["where"]]
            if len(wanted) > 1:
                print(f"{section}:")
            _display(df)
            shown += len(df)
    return shown


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:g}"


def published_row(row: dict[str, Any]) -> dict[str, str]:
    """One published row as text for a table: figures with their units, the workload in one cell, the engine with
    its version (what the date means stays in the data file)."""
    figures = "; ".join(f"{name} {_number(v)} {row['units'][name]}" for name, v in row["figures"].items())
    workload = ", ".join(f"{k} {v}" for k, v in row.get("workload", {}).items()) or "not stated"
    gpus = row.get("gpus", 1)
    return {"what": row["what"], "model": row["model"], "gpu": f"{gpus}× {row['gpu']}" if gpus > 1 else row["gpu"],
            "engine": f"{row['engine']} {row['engine_version']}", "precision": row["precision"], "workload": workload,
            "figures": figures, "source": row["source"], "date": row["date"]}


def _published(number: str, precision: Sequence[str] = ()) -> int:
    import pandas as pd

    try:
        rows = published.for_notebook(number)
    except FileNotFoundError as exc:
        print(f"No published GPU figures either: {exc}.")
        return 0
    if precision:
        rows = [r for r in rows if any(p.lower() in r["precision"].lower() for p in precision)]
    if not rows:
        kind = f" in {' or '.join(precision)}" if precision else ""
        print(f"No published GPU figure{kind} for notebook {number} ships in data/published_gpu.json either.")
        return 0
    print(HEADING)
    with pd.option_context("display.max_colwidth", None, "display.max_columns", None, "display.width", 100_000):
        _display(pd.DataFrame([published_row(r) for r in rows], columns=PUBLISHED_COLUMNS))
    return len(rows)
