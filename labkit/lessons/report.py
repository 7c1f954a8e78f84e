"""The capstone report (its runs are ``lessons.nb09.runs``): a before/after table, the highest concurrency that meets an SLO, a shareable
HTML + JSON pair, and the "class results": several learners' files merged into one comparison.

The JSON is a ``labkit.core.results`` file (rows plus the environment that produced them); the HTML is
self-contained (tables, plotly figures with plotly.js embedded, provenance), so it opens offline.
"""
from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import config, cpu, results

CONFIG_SECTION = "configs"  # one row per served configuration, all under the same load
SWEEP_SECTION = "slo_sweep"  # one row per (configuration, concurrency)
# the figures a before/after table compares: name → (label, higher is better)
COMPARED: dict[str, tuple[str, bool]] = {
    "request_throughput": ("requests/s", True),
    "output_tokens_per_s": ("output tokens/s", True),
    "e2e_mean_s": ("mean latency (s)", False),
    "e2e_p90_s": ("p90 latency (s)", False),  # p90: a capstone run has tens of requests, too few for a p99
    "ttft_p90_s": ("p90 TTFT (s)", False),
    "peak_rss_bytes": ("peak memory, process RSS (bytes)", False),
    "max_concurrency_meeting_slo": ("highest concurrency meeting the SLO", True),
}


# ----------------------------------------------------------------------------------- SLO and tables


def meets(row: dict[str, Any], min_good_fraction: float = 0.9) -> bool:
    """A load point meets the SLO when every request completed and at least ``min_good_fraction`` of them
    met it (``good_requests`` from ``labkit.serve.loadgen``'s summary)."""
    if not 0 < min_good_fraction <= 1:
        raise ValueError(f"min_good_fraction={min_good_fraction}: must lie in (0, 1]")
    done = row.get("completed") or 0
    return bool(done) and not row.get("failed") and (row.get("good_requests") or 0) >= min_good_fraction * done


def max_concurrency(rows: Sequence[dict[str, Any]], min_good_fraction: float = 0.9) -> int | None:
    """The highest ``concurrency`` among rows that meet the SLO (None when none does)."""
    ok = [int(r["concurrency"]) for r in rows if meets(r, min_good_fraction)]
    return max(ok) if ok else None


def before_after(before: dict[str, Any], after: dict[str, Any], metrics: dict[str, tuple[str, bool]] | None = None):
    """The before/after table: one row per figure, both values, and the change (after ÷ before, and
    whether it is better)."""
    import pandas as pd

    rows = []
    for key, (label, higher_better) in (metrics or COMPARED).items():
        b, a = before.get(key), after.get(key)
        ratio = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        better = None if ratio is None else (ratio > 1) == higher_better and ratio != 1
        rows.append({"figure": label, "key": key, "before": b, "after": a, "after / before": ratio, "better": better})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ choosing a precision


def pick_precision(rows: Sequence[dict[str, Any]], min_agreement: float) -> str:
    """The fastest row (``tokens_per_s``) whose greedy agreement with the reference is at least ``min_agreement``."""
    ok = [r for r in rows if r["agreement"] >= min_agreement]
    if not ok:
        raise ValueError(f"no precision keeps greedy agreement ≥ {min_agreement}; lower min_agreement or add fp32")
    return max(ok, key=lambda r: r["tokens_per_s"])["precision"]


# ------------------------------------------------------------------------------------------ writing


def _label(e: dict[str, Any]) -> str:
    hw = e.get("hardware", {}) or {}
    where = cpu.machine_line(hw)  # one CPU name covers several families: the ISA tells them apart
    cores = hw.get("cpu_cores_logical")
    if not hw.get("gpu") and cores:
        where += f", {cores} cores"
    return f"{where}, {str(e.get('date', '?'))[:10]}"


def to_html(res: results.Results, figures: Sequence[Any] = (), title: str | None = None,
            sections: Sequence[str] | None = None) -> str:
    """A self-contained HTML page: title, provenance, each section's table, then the figures."""
    title = title or f"labkit report: {res.name}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#f3f3f3}.prov{color:#555;font-size:13px}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='prov'>{html.escape(results.provenance(res) if res.env else res.name)}</p>"]
    for key, value in res.notes.items():
        parts.append(f"<p><b>{html.escape(str(key))}</b>: {html.escape(str(value))}</p>")
    names = sections if sections is not None else list(dict.fromkeys(r.get("section") for r in res.rows))
    for name in names:
        df = res.frame(name)
        if df.empty:
            continue
        df = df[[c for c in df.columns if not isinstance(df[c].iloc[0], (list, dict))]]
        parts.append(f"<h2>{html.escape(str(name))}</h2>" + df.to_html(index=False, na_rep="—", float_format="{:.4g}".format))
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False))
    hw = res.env.get("versions", {})
    parts.append(f"<p class='prov'>versions: {html.escape(', '.join(f'{k} {v}' for k, v in hw.items() if v))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(res: results.Results, figures: Sequence[Any] = (), out_dir: str | Path | None = None,
          title: str | None = None) -> dict[str, Path]:
    """Save ``res`` as ``<out_dir>/<name>.json`` (labkit results format) and ``<name>.html``; default
    out_dir is ``results/``. Both written atomically."""
    import tempfile

    out = Path(out_dir) if out_dir is not None else config.results_dir()
    out.mkdir(parents=True, exist_ok=True)
    json_path = res.save(out / f"{res.name}.json")  # captures the environment if not yet done
    page = to_html(res, figures, title)
    html_path = out / f"{res.name}.html"
    fd, tmp = tempfile.mkstemp(prefix=f".{html_path.name}.", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.replace(tmp, html_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"json": json_path, "html": html_path}


# ------------------------------------------------------------------------------------- class results


def merge(paths: Sequence[str | Path], section: str = CONFIG_SECTION):
    """Several learners' result files → one DataFrame: a row per (file, configuration) of ``section``, with
    who measured it where (``learner``: the file's folder and name, ``hardware``, ``device``, ``date``)."""
    import pandas as pd

    if not paths:
        raise ValueError("no result files: pass at least one path")
    frames = []
    for p in paths:
        path = Path(p)
        try:
            res = results.load(path)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such results file; pass paths of results/*.json files") from None
        rows = res.section(section)
        if not rows:
            have = sorted({r.get("section") for r in res.rows})
            raise ValueError(f"{path}: no rows in section {section!r}; it has {have}")
        df = pd.DataFrame(rows).drop(columns=["section"])
        df.insert(0, "learner", f"{path.parent.name}/{path.stem}")
        df.insert(1, "hardware", _label(res.env))
        df.insert(2, "device", res.env.get("device"))
        df.insert(3, "quick", res.env.get("quick"))
        df.insert(4, "mode", results.mode(res))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def merge_figure(df: Any, metric: str = "request_throughput", by: str = "config",
                 title: str = "Class results: the same load on everyone's machine"):
    """Grouped bars: ``metric`` for each configuration, one colour per learner's file; files of different modes
    (quick or full, other token counts: ``results.mode``) in separate panels, each with its own axis."""
    import plotly.express as px

    if metric not in df.columns:
        raise ValueError(f"no column {metric!r}; choose one of {sorted(c for c in df.columns if df[c].dtype.kind == 'f')}")
    df = df.assign(who=df["learner"] + " · " + df["hardware"])
    split = "mode" in df.columns and df["mode"].nunique() > 1  # quick and full runs never share an axis
    fig = px.bar(df, x=by, y=metric, color="who", barmode="group", title=title, text_auto=".3g",
                 facet_col="mode" if split else None)
    fig.update_layout(yaxis_title=COMPARED.get(metric, (metric,))[0], template="plotly_white", legend_title="")
    if split:
        fig.update_yaxes(matches=None, showticklabels=True)
    return fig
