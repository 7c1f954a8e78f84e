"""Collect a class's measurements: each learner packs results/*.json, the instructor merges them.

    python -m tools.merge_results pack --name alice          # learner: build/labkit-results-alice.zip
    python -m tools.merge_results pack --name alice --progress   # … and the exercise progress record (opt-in)
    python -m tools.merge_results merge submissions/         # instructor: build/class/{rows.csv,class.json,index.html}

``merge`` takes zip files and/or folders (a folder of zips, or one learner's results folder);
the learner's name comes from the zip name (labkit-results-NAME.zip) or the folder name. Each
file must be a labkit results file (labkit.core.results format, with its environment); anything
else is listed as skipped, never silently dropped.

build/class/index.html opens with the plots that answer the room's questions, from the sections
the notebooks write: each laptop's measured bandwidth against its batch-1 decode tokens/s with
the roofline (01_hardware_sizing: bandwidth, decode), each precision's decode speedup against
its greedy agreement with fp32 (02_fp16_bf16, 03_int8_int4: variants), and each learner's
batching gain (06_batching: static, serving); then one table per notebook section. plotly.js is
embedded in the page: it opens offline. A plot whose data no learner sent says so in one line.
Where learners packed their progress (``--progress``: each exercise's last verdict, hints asked, solutions shown),
the page then shows, per exercise, how many are done, wrong or not tried: where the room is stuck.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import statistics
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from labkit.core import config, results
from labkit.core import cpu
from labkit.lessons.exercises import progress

PACK_PREFIX = "labkit-results-"
PROGRESS_MEMBER = "progress/progress.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
MAX_NUMERIC_COLUMNS = 6
PLOT_HEIGHT_PX = 460


@dataclass
class Submission:
    learner: str
    file: str
    res: results.Results


def pack(name: str, results_dir: Path, out_dir: Path, progress_file: Path | None = None) -> Path:
    """Zip every results file with a name the instructor's merge recognises (and the progress record, when given)."""
    if not _NAME.match(name):
        raise ValueError(f"name {name!r}: use letters, digits, '_', '-' or '.' (e.g. 'alice' or 'team-3')")
    files = sorted(results_dir.glob("*.json"))
    if not files:
        raise ValueError(f"no results in {results_dir}: run the notebooks first (or `make run`)")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{PACK_PREFIX}{name}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            zf.write(f, f"results/{f.name}")
        if progress_file is not None:
            if not progress_file.is_file():
                raise ValueError(f"no progress record at {progress_file}: run an exercise's check first, or pack "
                                 "without --progress")
            zf.write(progress_file, PROGRESS_MEMBER)
    return out


def collect_progress(sources: list[Path]) -> dict[str, dict[str, Any]]:
    """Learner → the progress record packed in their zip (only those who packed one)."""
    out: dict[str, dict[str, Any]] = {}
    for src in sources:
        zips = sorted(src.rglob("*.zip")) if src.is_dir() else [src] if src.suffix == ".zip" else []
        for z in zips:
            try:
                with zipfile.ZipFile(z) as zf:
                    if PROGRESS_MEMBER in zf.namelist():
                        record = json.loads(zf.read(PROGRESS_MEMBER).decode("utf-8"))
                        if isinstance(record, dict) and isinstance(record.get("exercises"), dict):
                            out[_learner_from(z)] = record
            except (zipfile.BadZipFile, OSError, ValueError):
                continue  # listed as skipped by collect()
    return out


def progress_html(records: dict[str, dict[str, Any]]) -> str:
    """Per exercise: learners done / wrong / not tried, hints asked and solutions shown."""
    if not records:
        return "<p class='none'>No learner packed a progress record (pack --progress).</p>"
    ids = sorted({ex for r in records.values() for ex in r["exercises"]})
    rows = []
    for ex in ids:
        entries = [r["exercises"].get(ex, {}) for r in records.values()]
        count = {s: sum(e.get("status") == s for e in entries) for s in ("correct", "wrong")}
        rows.append(f"<tr><td>{html.escape(ex)}</td><td>{count['correct']}</td><td>{count['wrong']}</td>"
                    f"<td>{len(entries) - count['correct'] - count['wrong']}</td>"
                    f"<td>{sum(int(e.get('hints', 0)) for e in entries)}</td>"
                    f"<td>{sum(bool(e.get('solution')) for e in entries)}</td></tr>")
    return (f"<h2 id='progress'>Where the room is stuck ({len(records)} learners packed their progress)</h2>"
            "<table><tr><th>exercise</th><th>done</th><th>wrong</th><th>not tried</th><th>hints asked</th>"
            "<th>solutions shown</th></tr>" + "".join(rows) + "</table>")


def _learner_from(path: Path) -> str:
    stem = path.stem if path.suffix == ".zip" else path.name
    if stem == "results" and path.parent.name:
        stem = path.parent.name  # alice/results/ → alice
    return stem.removeprefix(PACK_PREFIX)


def _read(learner: str, label: str, raw: bytes, out: list[Submission], skipped: list[str]) -> None:
    """One results file into ``out``, or one line into ``skipped`` naming the learner, the file and why."""
    try:
        out.append(Submission(learner, label, results.Results.from_dict(json.loads(raw.decode("utf-8")))))
    except UnicodeDecodeError as exc:
        skipped.append(f"{learner}: {label}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        skipped.append(f"{learner}: {label}: {exc}")


def collect(sources: list[Path]) -> tuple[list[Submission], list[str]]:
    """Every results file in the given zips and folders, with the learner it came from.

    A folder may hold zips, a learner's *.json (learner = folder name, or its parent's for a
    folder named ``results``), a ``results/`` folder, or learners' folders (searched in turn)."""
    subs: list[Submission] = []
    skipped: list[str] = []
    for src in sources:
        if src.is_dir():
            for f in sorted(src.glob("*.json")):
                _read(_learner_from(src), f.name, f.read_bytes(), subs, skipped)
            inner = [p for p in sorted(src.iterdir()) if p.suffix == ".zip" or p.is_dir()]
            more_subs, more_skipped = collect(inner)
            subs += more_subs
            skipped += more_skipped
        elif src.suffix == ".zip":
            _read_zip(src, subs, skipped)
        elif src.suffix == ".json":
            _read(_learner_from(src.parent), src.name, src.read_bytes(), subs, skipped)
        else:
            raise ValueError(f"{src}: give zip files (labkit-results-NAME.zip), results folders or .json files")
    return subs, skipped


def _read_zip(src: Path, subs: list[Submission], skipped: list[str]) -> None:
    """Every results file in one learner's zip; a zip that cannot be read is skipped as a whole."""
    learner = _learner_from(src)
    try:
        with zipfile.ZipFile(src) as zf:
            for member in sorted(n for n in zf.namelist() if n.endswith(".json") and n != PROGRESS_MEMBER):
                try:
                    raw = zf.read(member)
                except (zipfile.BadZipFile, OSError, RuntimeError, ValueError) as exc:  # damaged or encrypted member
                    skipped.append(f"{learner}: {src.name}/{member}: unreadable ({exc})")
                    continue
                _read(learner, Path(member).name, raw, subs, skipped)
    except (zipfile.BadZipFile, OSError) as exc:
        skipped.append(f"{learner}: {src.name}: not a readable zip file ({exc})")


def _machine(env: dict[str, Any]) -> str:
    hw = env.get("hardware", {})
    return str(cpu.machine_line(hw))  # the ISA groups the class's CPUs by family


def rows_table(subs: list[Submission]):
    """One row per measurement, with who measured it, on what, in which mode."""
    import pandas as pd

    records = []
    for s in subs:
        e = s.res.env
        for row in s.res.rows:
            records.append({"learner": s.learner, "notebook": s.res.name, "isa_class": _class(s), "machine": _machine(e),
                            "device": e.get("device"), "quick": e.get("quick"), "model": e.get("model"),
                            "date": e.get("date"), **row})
    return pd.DataFrame(records)


def _numeric(df) -> list[str]:
    import pandas as pd

    skip = {"quick"}
    cols = [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c]) and df[c].notna().any()
            and not pd.api.types.is_bool_dtype(df[c])]
    return cols[:MAX_NUMERIC_COLUMNS]


def _ok_rows(res: results.Results, section: str) -> list[dict[str, Any]]:
    return [r for r in res.section(section) if r.get("status", "ok") == "ok"]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _label(s: Submission) -> str:
    return f"{s.learner} · {_machine(s.res.env)}"


def _class(s: Submission) -> str:
    """The ISA class the plots and tables group a learner's results by (``cpu.isa_class``)."""
    return cpu.isa_class(s.res.env.get("hardware") or {})


def roofline_points(subs: list[Submission]) -> list[dict[str, Any]]:
    """Per 01_hardware_sizing file: bandwidth (GB/s), batch-1 (else smallest batch) measured and
    ceiling decode tokens/s, and the bytes one token reads (bandwidth ÷ ceiling)."""
    points = []
    for s in subs:
        if s.res.name != "01_hardware_sizing":
            continue
        bw = next((_num(r.get("bandwidth_gbs")) for r in s.res.section("bandwidth") if _num(r.get("bandwidth_gbs"))), None)
        decode = [r for r in s.res.section("decode") if _num(r.get("measured_tokens_per_s")) and _num(r.get("batch"))]
        if not bw or not decode:
            continue
        d = min(decode, key=lambda r: r["batch"])
        ceiling = _num(d.get("ceiling_tokens_per_s"))
        points.append({"learner": s.learner, "label": _label(s), "model": str(s.res.env.get("model") or "default"),
                       "isa_class": _class(s), "bandwidth_gbs": bw, "batch": d["batch"], "tokens_per_s": d["measured_tokens_per_s"],
                       "ceiling_tokens_per_s": ceiling,
                       "bytes_per_token": bw * 1e9 / ceiling if ceiling else None})
    return points


def precision_points(subs: list[Submission]) -> list[dict[str, Any]]:
    """Per learner and precision (02 and 03 'variants' that ran): decode speedup over the same
    file's fp32 row, and greedy agreement with fp32."""
    points = []
    for s in subs:
        if s.res.name not in ("02_fp16_bf16", "03_int8_int4"):
            continue
        rows = _ok_rows(s.res, "variants")
        base = next((r for r in rows if r.get("variant") == "fp32" and _num(r.get("decode_tokens_per_s"))), None)
        if base is None:
            continue
        for r in rows:
            tps = _num(r.get("decode_tokens_per_s"))
            if r is base or tps is None:
                continue
            points.append({"learner": s.learner, "label": _label(s), "isa_class": _class(s), "notebook": s.res.name,
                           "variant": str(r["variant"]),
                           "speedup": tps / base["decode_tokens_per_s"], "agreement": _num(r.get("agreement")),
                           "kl": _num(r.get("kl"))})
    return points


def batching_points(subs: list[Submission]) -> list[dict[str, Any]]:
    """Per 06_batching file: total tokens/s at the largest static batch over batch 1, and the
    server's output tokens/s at its largest max_batch_size over max_batch_size 1."""
    points = []
    for s in subs:
        if s.res.name != "06_batching":
            continue
        gains: dict[str, Any] = {}
        for section, size, value in (("static", "batch_size", "total_tokens_per_s"),
                                     ("serving", "max_batch_size", "output_tokens_per_s")):
            rows = sorted((r for r in _ok_rows(s.res, section) if _num(r.get(size)) and _num(r.get(value))),
                          key=lambda r: r[size])
            if len(rows) >= 2 and rows[0][size] == 1:
                gains[section] = (rows[-1][value] / rows[0][value], rows[-1][size])
        if gains:
            points.append({"learner": s.learner, "label": _label(s), "isa_class": _class(s),
                           **{f"{k}_gain": v[0] for k, v in gains.items()},
                           **{f"{k}_size": v[1] for k, v in gains.items()}})
    return points


def _figure_html(fig) -> str:
    fig.update_layout(template="plotly_white", height=PLOT_HEIGHT_PX, margin={"t": 60, "r": 20, "b": 60, "l": 70})
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True, "displaylogo": False})


def roofline_figure(points: list[dict[str, Any]]):
    import plotly.graph_objects as go

    fig = go.Figure()
    top = max(p["bandwidth_gbs"] for p in points) * 1.15
    by_model: dict[str, list[float]] = {}
    for p in points:
        if p["bytes_per_token"]:
            by_model.setdefault(p["model"], []).append(p["bytes_per_token"])
    for model, per_token in sorted(by_model.items()):
        b = statistics.median(per_token)
        fig.add_scatter(x=[0, top], y=[0, top * 1e9 / b], mode="lines", line={"dash": "dash"},
                        name=f"roofline {model}: bandwidth ÷ {b / 1e6:.0f} MB per token")
    for model, isa in sorted({(p["model"], p.get("isa_class", "ISA not recorded")) for p in points}):
        mine = [p for p in points if p["model"] == model and p.get("isa_class", "ISA not recorded") == isa]
        fig.add_scatter(x=[p["bandwidth_gbs"] for p in mine], y=[p["tokens_per_s"] for p in mine],
                        mode="markers+text", text=[p["learner"] for p in mine], textposition="top center",
                        hovertext=[f"{p['label']}: batch {p['batch']}, {p['tokens_per_s']:.1f} tokens/s, "
                                   f"ceiling {p['ceiling_tokens_per_s'] or 0:.1f}" for p in mine],
                        marker={"size": 11}, name=f"measured ({model}, {isa})")  # one trace per ISA class
    fig.update_layout(title="Memory bandwidth against decode speed: each laptop and its roofline",
                      xaxis_title="measured bandwidth (GB/s)", yaxis_title="decode tokens/s (batch 1)",
                      xaxis_rangemode="tozero", yaxis_rangemode="tozero", legend={"orientation": "h", "y": -0.2})
    return fig


def precision_figure(points: list[dict[str, Any]]):
    import plotly.colors
    from plotly.subplots import make_subplots

    variants = sorted({p["variant"] for p in points})
    learners = sorted({p["learner"] for p in points}, key=lambda n: (_class_of(points, n), n))  # grouped by ISA
    fig = make_subplots(rows=1, cols=2, subplot_titles=("decode speedup over fp32 (×)", "greedy agreement with fp32"),
                        horizontal_spacing=0.1)
    palette = plotly.colors.qualitative.Plotly
    for i, learner in enumerate(learners):
        mine = {p["variant"]: p for p in points if p["learner"] == learner}
        xs = [v for v in variants if v in mine]
        color = {"color": palette[i % len(palette)]}  # one colour per learner in both panels
        fig.add_bar(x=xs, y=[mine[v]["speedup"] for v in xs], name=f"{learner} ({_class_of(points, learner)})",
                    legendgroup=learner, marker=color, row=1, col=1)
        fig.add_bar(x=xs, y=[mine[v]["agreement"] for v in xs], name=learner, legendgroup=learner, marker=color,
                    showlegend=False, row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_layout(title="Each precision: how much faster, and does it still answer like fp32?", barmode="group",
                      legend={"orientation": "h", "y": -0.2})
    return fig


def _class_of(points: list[dict[str, Any]], learner: str) -> str:
    return next((p.get("isa_class", "ISA not recorded") for p in points if p["learner"] == learner), "ISA not recorded")


def batching_figure(points: list[dict[str, Any]]):
    import plotly.graph_objects as go

    fig = go.Figure()
    names = {"static_gain": "static batch: largest vs 1 (total tokens/s ×)",
             "serving_gain": "server: max_batch_size largest vs 1 (output tokens/s ×)"}
    for key, name in names.items():
        have = sorted((p for p in points if key in p), key=lambda p: (p.get("isa_class", ""), p["learner"]))
        if have:
            size = key.replace("gain", "size")
            fig.add_bar(x=[f"{p['learner']} ({p.get('isa_class', '?')})" for p in have], y=[p[key] for p in have], name=name,
                        hovertext=[f"{p['label']}: batch {p[size]}" for p in have])
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="Batching gain per learner", barmode="group", yaxis_title="throughput gain (×)",
                      legend={"orientation": "h", "y": -0.2})
    return fig


PLOTS = [  # (anchor, question, points, figure, the notebook and sections it needs)
    ("roofline", "How close does each laptop's decode get to what its memory bandwidth allows?",
     roofline_points, roofline_figure, "01_hardware_sizing (sections bandwidth and decode)"),
    ("precision", "Which precision is faster on whose laptop, and does it still answer like fp32?",
     precision_points, precision_figure, "02_fp16_bf16 or 03_int8_int4 (section variants, with its fp32 row)"),
    ("batching", "How much does batching multiply throughput on each laptop?",
     batching_points, batching_figure, "06_batching (sections static or serving, from batch 1 up)"),
]


def plots_html(subs: list[Submission]) -> tuple[str, dict[str, int]]:
    """The plots' sections, and how many points each one drew. Files of different modes (quick or full, other
    token counts: ``results.mode``) are never drawn together: each mode gets its own copy of each plot."""
    parts, drawn = [], {}
    modes = sorted({results.mode(s.res) for s in subs})
    for anchor, question, points_of, figure_of, needs in PLOTS:
        drawn[anchor] = 0
        bodies = []
        for m in modes or [""]:
            points = points_of([s for s in subs if results.mode(s.res) == m])
            drawn[anchor] += len(points)
            if len(modes) > 1 and points:
                bodies.append(f"<h3>{html.escape(m)} mode</h3>")
            if points:
                bodies.append(_figure_html(figure_of(points)))
        body = "".join(bodies) or (f"<p class='none'>No learner's results have this yet: it needs "
                                   f"{html.escape(needs)}.</p>")
        parts.append(f"<section class='plot' id='{anchor}'><h2>{html.escape(question)}</h2>{body}</section>")
    return "".join(parts), drawn


def class_html(df, skipped: list[str], subs: list[Submission] | None = None,
               progress: dict[str, dict[str, Any]] | None = None) -> str:
    """The plots first (see ``PLOTS``), then per notebook and section one line per learner, the
    median of each numeric column. plotly.js is inlined once: the page needs no network."""
    from plotly.offline import get_plotlyjs

    parts = [f"<p>{df['learner'].nunique()} learners · {len(df)} measurement rows · "
             f"{df['notebook'].nunique()} notebooks</p>"] if len(df) else ["<p>no results merged</p>"]
    plots, _ = plots_html(subs or [])
    parts.append(plots)
    if progress is not None:
        parts.append(progress_html(progress))
    if skipped:
        parts.append("<p><b>skipped files</b></p><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in skipped) + "</ul>")
    parts.append("<h2 id='tables'>Every section, one line per learner</h2>")
    for (nb, section), part in (df.groupby(["notebook", "section"], sort=True) if len(df) else []):
        part = part.dropna(axis=1, how="all")
        cols = _numeric(part.drop(columns=["learner", "notebook", "isa_class", "machine", "device", "model", "date",
                                           "section"], errors="ignore"))
        head = "".join(f"<th>{html.escape(c)} (median)</th>" for c in cols)
        body = []
        for (_, learner, machine, device, quick), g in part.groupby(["isa_class", "learner", "machine", "device", "quick"],
                                                                    dropna=False):  # grouped by ISA class first
            vals = "".join(f"<td>{statistics.median(g[c].dropna()):.4g}</td>" if g[c].notna().any() else "<td>–</td>"
                           for c in cols)
            body.append(f"<tr><td>{html.escape(str(learner))}</td><td>{html.escape(str(machine))}</td>"
                        f"<td>{html.escape(str(device))}</td><td>{'quick' if quick else 'full'}</td>"
                        f"<td>{len(g)}</td>{vals}</tr>")
        parts.append(f"<h3>{html.escape(nb)} · {html.escape(str(section))}</h3><table><tr><th>learner</th>"
                     f"<th>machine</th><th>device</th><th>mode</th><th>rows</th>{head}</tr>{''.join(body)}</table>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit class results</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #d0d7de;padding:.25em .5em;text-align:left;font-size:.9em}th{background:#f6f8fa}"
            "section.plot{max-width:1100px}p.none{color:#656d76;font-style:italic}"
            "</style><script>" + get_plotlyjs() + "</script></head><body><h1>labkit class results</h1>"
            + "".join(parts) + "</body></html>\n")


def merge(sources: list[Path], out_dir: Path) -> dict[str, Any]:
    subs, skipped = collect(sources)
    progress = collect_progress(sources)
    df = rows_table(subs)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "rows.csv", index=False)
    results.write_json_atomic(out_dir / "class.json", {
        "learners": sorted({s.learner for s in subs}), "skipped": skipped,
        "submissions": [{"learner": s.learner, "file": s.file, **s.res.to_dict()} for s in subs],
        "progress": progress})
    (out_dir / "index.html").write_text(class_html(df, skipped, subs, progress), encoding="utf-8")
    return {"learners": sorted({s.learner for s in subs}), "files": len(subs), "rows": len(df), "skipped": skipped,
            "progress": sorted(progress)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="zip this machine's results/*.json for the instructor")
    p.add_argument("--name", required=True, help="your name or team (letters, digits, _ - .)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default: LABKIT_RESULTS or results/)")
    p.add_argument("--out", type=Path, default=ROOT / "build")
    p.add_argument("--progress", action="store_true", help="also pack your exercise progress record (labkit's "
                   "cache, or LABKIT_PROGRESS), so the instructor sees where the room is stuck")
    m = sub.add_parser("merge", help="merge learners' zips or folders into build/class/")
    m.add_argument("sources", nargs="+", type=Path)
    m.add_argument("--out", type=Path, default=ROOT / "build" / "class")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            record = None
            if args.progress:
                            record = progress.path()
            print(pack(args.name, args.results or config.results_dir(), args.out, record))
        else:
            missing = [str(s) for s in args.sources if not s.exists()]
            if missing:
                raise ValueError(f"not found: {missing}")
            info = merge(args.sources, args.out)
            print(f"{len(info['learners'])} learners, {info['files']} files, {info['rows']} rows → "
                  f"{args.out / 'index.html'}, rows.csv, class.json")
            for s in info["skipped"]:
                print("skipped:", s)
            if info["skipped"]:
                print(f"{len(info['skipped'])} file(s) skipped, the rest merged")
    except ValueError as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
