"""What a run of notebooks produced (``tools.run_notebooks``): each notebook's status, timings and results, and
the summary written to build/summary.json and build/summary.html.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat

from labkit.core import config, env, results
from labkit.lessons import findings

ROOT = Path(__file__).resolve().parent.parent
RESULT_ROWS_SHOWN = 6
RESULT_COLUMNS_SHOWN = 8
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class FailedCell:
    index: int  # 0-based position in notebook.cells
    source_excerpt: str
    error: str  # "ename: evalue"
    traceback_tail: str


@dataclass
class NotebookRun:
    name: str
    path: str
    executed_path: str
    status: str  # "ok" | "failed" | "timeout" | "kernel died" | "kernel error"
    wall_s: float
    quick: bool  # LABKIT_QUICK was set
    finished_at: str  # UTC, ISO 8601: a summary keeps earlier runs of notebooks not run this time
    n_cells: int
    n_code_cells: int
    slowest_cells: list[dict[str, Any]] = field(default_factory=list)
    failed_cell: FailedCell | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    exercises: dict[str, str] = field(default_factory=dict)  # exercise id -> the verdict its check printed
    output_words: int = 0  # words the run printed for a reader (printed text, tables as text; charts not counted)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _cell_seconds(cell: nbformat.NotebookNode) -> float | None:
    """Execution time recorded by nbclient (record_timing) in the cell's metadata."""
    ex = cell.get("metadata", {}).get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return None
    return (_parse_time(end) - _parse_time(start)).total_seconds()


def _parse_time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def slowest(nb: nbformat.NotebookNode, n: int = 3) -> list[dict[str, Any]]:
    timed = [(i, _cell_seconds(c)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    timed = [(i, s) for i, s in timed if s is not None]
    timed.sort(key=lambda t: -t[1])
    return [{"index": i, "seconds": round(s, 2), "first_line": nb.cells[i].source.split("\n", 1)[0][:80]}
            for i, s in timed[:n]]


def _short(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, str) and len(value) > 60:
        return value[:57] + "…"
    if isinstance(value, (list, dict)):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "…"
    return value


def headline(res: results.Results) -> dict[str, Any] | None:
    """The one number a notebook's results lead with, as the notebook recorded it (``findings.record`` writes the
    first takeaway row into the notes): ``{"label", "value"}`` (and its ``verdict`` where one judged it); None
    when the notebook recorded none."""
    head = res.notes.get(findings.HEADLINE)
    if not isinstance(head, dict) or "label" not in head or "value" not in head:
        return None
    return dict(head)


def key_results(name: str, since_epoch_s: float) -> list[dict[str, Any]]:
    """The results files this notebook wrote: ``results/<name>.json`` and any other saved during its run.

    Per file and section: row count, columns and the first rows (values shortened)."""
    rdir = config.results_dir()
    paths = {p for p in rdir.glob("*.json") if p.stat().st_mtime >= since_epoch_s}
    own = rdir / f"{name}.json"
    if own.is_file():
        paths.add(own)
    out = []
    for path in sorted(paths):
        try:
            res = results.load(path)
        except (ValueError, json.JSONDecodeError) as exc:
            out.append({"file": path.name, "error": f"unreadable results file: {exc}"})
            continue
        sections: dict[str, list[dict[str, Any]]] = {}
        for row in res.rows:
            sections.setdefault(str(row.get("section", "")), []).append(row)
        summary = []
        for section, rows in sections.items():
            columns = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "section"]
            shown = columns[:RESULT_COLUMNS_SHOWN]
            summary.append({"section": section, "n_rows": len(rows), "columns": columns,
                            "rows": [{k: _short(r.get(k)) for k in shown} for r in rows[:RESULT_ROWS_SHOWN]]})
        out.append({"file": path.name, "fresh": path.stat().st_mtime >= since_epoch_s,
                    "notes": res.notes, "headline": headline(res), "sections": summary})
    return out


def output_words(nb: nbformat.NotebookNode) -> int:
    """Words a learner reads in ``nb``'s outputs: printed text and the text of tables (``text/plain``), left out the
    charts (plotly HTML), widgets and progress bars, which are looked at, not read word by word."""
    words = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text = "".join(out.get("text", ""))
            elif out.get("output_type") in ("display_data", "execute_result"):
                data = out.get("data", {})
                if "application/vnd.jupyter.widget-view+json" in data or "plotly" in "".join(data.get("text/html", ""))[:2000]:
                    continue
                text = "".join(data.get("text/plain", ""))
            else:
                continue
            words += len(re.findall(r"[A-Za-z][A-Za-z'’-]+", ANSI.sub("", text)))  # a word: two letters or more
    return words


def summary_dict(runs: list[NotebookRun], run_wall_s: float, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """This run's notebooks, plus earlier entries (from ``previous``) for notebooks not run now
    whose file still exists, so ``--only`` refreshes part of the summary without losing the rest."""
    entries = {r.name: asdict(r) for r in runs}
    for old in (previous or {}).get("notebooks", []):
        if old["name"] not in entries and (ROOT / old["path"]).is_file():
            entries[old["name"]] = old
    notebooks = [entries[k] for k in sorted(entries)]
    return {
        "quick": config.quick(),
        "environment": env.environment(),
        "run_wall_s": round(run_wall_s, 2),
        "total_wall_s": round(sum(n["wall_s"] for n in notebooks), 2),
        "n_notebooks": len(notebooks),
        "n_failed": sum(n["status"] != "ok" for n in notebooks),
        "notebooks": notebooks,
    }


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#1f2328;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #d0d7de;padding:.25em .5em;
text-align:left;vertical-align:top;font-size:.9em}th{background:#f6f8fa}
.ok{color:#1a7f37;font-weight:bold}.bad{color:#cf222e;font-weight:bold}
pre{background:#f6f8fa;padding:.5em;overflow-x:auto;font-size:.85em}
h2{margin-top:1.5em;border-bottom:1px solid #d0d7de}.muted{color:#656d76}
td.num{text-align:right;font-variant-numeric:tabular-nums}table.short td{font-size:1em}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _results_html(files: list[dict[str, Any]]) -> str:
    if not files:
        return "<p class='muted'>no results file saved</p>"
    parts = []
    for f in files:
        if "error" in f:
            parts.append(f"<p class='bad'>{_e(f['file'])}: {_e(f['error'])}</p>")
            continue
        stale = "" if f["fresh"] else " <span class='bad'>(not rewritten by this run)</span>"
        parts.append(f"<p><code>results/{_e(f['file'])}</code>{stale}</p>")
        for s in f["sections"]:
            cols = list(s["rows"][0]) if s["rows"] else []
            head = "".join(f"<th>{_e(c)}</th>" for c in cols)
            body = "".join("<tr>" + "".join(f"<td>{_e(r.get(c))}</td>" for c in cols) + "</tr>" for r in s["rows"])
            more = s["n_rows"] - len(s["rows"])
            extra = f" · {more} more rows in the file" if more > 0 else ""
            hidden = len(s["columns"]) - len(cols)
            extra += f" · {hidden} more columns" if hidden > 0 else ""
            parts.append(f"<p><b>{_e(s['section'])}</b> <span class='muted'>{s['n_rows']} rows{extra}</span></p>"
                         f"<table><tr>{head}</tr>{body}</table>")
    return "".join(parts)


def notebook_headline(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The headline of a notebook's own results file (``results/<name>.json``) in its summary entry."""
    own = [f for f in entry.get("results", []) if f.get("file") == f"{entry['name']}.json"]
    return own[0].get("headline") if own else None


def _headline_cells(h: dict[str, Any] | None) -> str:
    if not h:
        return "<td class='muted'>no number saved</td><td></td>"
    value = h["value"]
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    note = f" <span class='muted'>({_e(h['verdict'])})</span>" if h.get("verdict") else ""
    return f"<td class='num'>{_e(text)}</td><td>{_e(h['label'])}{note}</td>"


def short_table(summary: dict[str, Any]) -> str:
    """One line per notebook: status, wall time and its headline number."""
    rows = []
    for r in summary["notebooks"]:
        cls = "ok" if r["status"] == "ok" else "bad"
        rows.append(f"<tr><td><a href='#{_e(r['name'])}'>{_e(r['name'])}</a></td><td class='{cls}'>{_e(r['status'])}</td>"
                    f"<td class='num'>{r['wall_s']:.1f}</td>{_headline_cells(notebook_headline(r))}</tr>")
    foot = ("<p class='muted'>Headline: the number each notebook recorded as its first takeaway "
            "(<code>labkit.lessons.findings.record</code>), with its verdict where one judged it.</p>")
    return ("<table class='short'><tr><th>notebook</th><th>status</th><th>time (s)</th><th>headline</th>"
            "<th>what it is</th></tr>" + "".join(rows) + "</table>" + foot)


def summary_html(summary: dict[str, Any]) -> str:
    e = summary["environment"]
    hw = e.get("hardware", {})
    mode = "quick (LABKIT_QUICK=1)" if summary["quick"] else "full"
    modes = {bool(r.get("quick")) for r in summary["notebooks"]}
    if len(modes) > 1:
        mode += " — this summary mixes quick and full runs (see the mode column)"
    rows = []
    for r in summary["notebooks"]:
        cls = "ok" if r["status"] == "ok" else "bad"
        slow = "<br>".join(f"cell {c['index']}: {c['seconds']} s <code>{_e(c['first_line'])}</code>"
                           for c in r["slowest_cells"])
        rows.append(f"<tr><td><a href='#{_e(r['name'])}'>{_e(r['name'])}</a></td><td class='{cls}'>{_e(r['status'])}</td>"
                    f"<td>{r['wall_s']:.1f}</td><td>{r['n_code_cells']}</td><td>{slow}</td>"
                    f"<td>{'quick' if r.get('quick') else 'full'}</td><td>{_e(r.get('finished_at'))}</td></tr>")
    details = []
    for r in summary["notebooks"]:
        block = [f"<h2 id='{_e(r['name'])}'>{_e(r['name'])} — "
                 f"<span class='{'ok' if r['status'] == 'ok' else 'bad'}'>{_e(r['status'])}</span> "
                 f"in {r['wall_s']:.1f} s</h2>",
                 f"<p class='muted'>executed copy: <code>{_e(r['executed_path'])}</code></p>"]
        fc = r.get("failed_cell")
        if fc:
            block.append(f"<p class='bad'>failing cell {fc['index']} (0-based): {_e(fc['error'])}</p>"
                         f"<pre>{_e(fc['source_excerpt'])}</pre><pre>{_e(fc['traceback_tail'])}</pre>")
        block.append(_results_html(r["results"]))
        details.append("".join(block))
    failed = summary["n_failed"]
    verdict = (f"<span class='ok'>all {summary['n_notebooks']} notebooks passed</span>" if not failed
               else f"<span class='bad'>{failed} of {summary['n_notebooks']} notebooks failed</span>")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit run summary</title>"
            f"<style>{_CSS}</style></head><body><h1>labkit run summary</h1>"
            f"<p>{verdict} · mode: {_e(mode)} · notebooks' total {summary['total_wall_s']:.1f} s "
            f"(this run {summary['run_wall_s']:.1f} s) · {_e(e.get('date'))}</p>"
            + short_table(summary) +
            f"<h2>Runs</h2><p class='muted'>{_e(hw.get('cpu'))} ({_e(hw.get('cpu_cores_logical'))} cores) · "
            f"device {_e(e.get('device'))} · GPU {_e(hw.get('gpu') or 'none')} · model {_e(e.get('model'))} · "
            + " · ".join(f"{_e(k)} {_e(v)}" for k, v in e.get("versions", {}).items() if v)
            + "</p><table><tr><th>notebook</th><th>status</th><th>wall s</th><th>code cells</th>"
              "<th>slowest cells</th><th>mode</th><th>finished (UTC)</th></tr>" + "".join(rows) + "</table>" + "".join(details)
            + "</body></html>\n")


def write_summary(runs: list[NotebookRun], run_wall_s: float, build_dir: Path) -> dict[str, Any]:
    path = build_dir / "summary.json"
    previous = None
    if path.is_file():
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            previous = None  # a damaged summary is rebuilt from this run alone
    summary = summary_dict(runs, run_wall_s, previous)
    results.write_json_atomic(path, summary)
    (build_dir / "summary.html").write_text(summary_html(summary), encoding="utf-8")
    return summary
