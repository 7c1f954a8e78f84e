"""Collect a class's measurements: each learner packs results/*.json, the instructor merges them.

    python tools/merge_results.py pack --name alice          # learner: build/labkit-results-alice.zip
    python tools/merge_results.py merge submissions/         # instructor: build/class/{rows.csv,class.json,index.html}

``merge`` takes zip files and/or folders (a folder of zips, or one learner's results folder);
the learner's name comes from the zip name (labkit-results-NAME.zip) or the folder name. Each
file must be a labkit results file (labkit.results format, with its environment); anything
else is listed as skipped, never silently dropped.
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
sys.path.insert(0, str(ROOT))

from labkit import config, results  # noqa: E402

PACK_PREFIX = "labkit-results-"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
MAX_NUMERIC_COLUMNS = 6


@dataclass
class Submission:
    learner: str
    file: str
    res: results.Results


def pack(name: str, results_dir: Path, out_dir: Path) -> Path:
    """Zip every results file with a name the instructor's merge recognises."""
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
    return out


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
            for member in sorted(n for n in zf.namelist() if n.endswith(".json")):
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
    return str(hw.get("gpu") or hw.get("cpu") or "unknown")


def rows_table(subs: list[Submission]):
    """One row per measurement, with who measured it, on what, in which mode."""
    import pandas as pd

    records = []
    for s in subs:
        e = s.res.env
        for row in s.res.rows:
            records.append({"learner": s.learner, "notebook": s.res.name, "machine": _machine(e),
                            "device": e.get("device"), "quick": e.get("quick"), "model": e.get("model"),
                            "date": e.get("date"), **row})
    return pd.DataFrame(records)


def _numeric(df) -> list[str]:
    import pandas as pd

    skip = {"quick"}
    cols = [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c]) and df[c].notna().any()
            and not pd.api.types.is_bool_dtype(df[c])]
    return cols[:MAX_NUMERIC_COLUMNS]


def class_html(df, skipped: list[str]) -> str:
    """Per notebook and section: one line per learner, the median of each numeric column."""
    parts = [f"<p>{df['learner'].nunique()} learners · {len(df)} measurement rows · "
             f"{df['notebook'].nunique()} notebooks</p>"] if len(df) else ["<p>no results merged</p>"]
    if skipped:
        parts.append("<p><b>skipped files</b></p><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in skipped) + "</ul>")
    for (nb, section), part in (df.groupby(["notebook", "section"], sort=True) if len(df) else []):
        part = part.dropna(axis=1, how="all")
        cols = _numeric(part.drop(columns=["learner", "notebook", "machine", "device", "model", "date", "section"],
                                  errors="ignore"))
        head = "".join(f"<th>{html.escape(c)} (median)</th>" for c in cols)
        body = []
        for (learner, machine, device, quick), g in part.groupby(["learner", "machine", "device", "quick"], dropna=False):
            vals = "".join(f"<td>{statistics.median(g[c].dropna()):.4g}</td>" if g[c].notna().any() else "<td>–</td>"
                           for c in cols)
            body.append(f"<tr><td>{html.escape(str(learner))}</td><td>{html.escape(str(machine))}</td>"
                        f"<td>{html.escape(str(device))}</td><td>{'quick' if quick else 'full'}</td>"
                        f"<td>{len(g)}</td>{vals}</tr>")
        parts.append(f"<h2>{html.escape(nb)} · {html.escape(str(section))}</h2><table><tr><th>learner</th>"
                     f"<th>machine</th><th>device</th><th>mode</th><th>rows</th>{head}</tr>{''.join(body)}</table>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>labkit class results</title><style>"
            "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #d0d7de;padding:.25em .5em;text-align:left;font-size:.9em}th{background:#f6f8fa}"
            "</style></head><body><h1>labkit class results</h1>" + "".join(parts) + "</body></html>\n")


def merge(sources: list[Path], out_dir: Path) -> dict[str, Any]:
    subs, skipped = collect(sources)
    df = rows_table(subs)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "rows.csv", index=False)
    results.write_json_atomic(out_dir / "class.json", {
        "learners": sorted({s.learner for s in subs}), "skipped": skipped,
        "submissions": [{"learner": s.learner, "file": s.file, **s.res.to_dict()} for s in subs]})
    (out_dir / "index.html").write_text(class_html(df, skipped), encoding="utf-8")
    return {"learners": sorted({s.learner for s in subs}), "files": len(subs), "rows": len(df), "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="zip this machine's results/*.json for the instructor")
    p.add_argument("--name", required=True, help="your name or team (letters, digits, _ - .)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default: LABKIT_RESULTS or results/)")
    p.add_argument("--out", type=Path, default=ROOT / "build")
    m = sub.add_parser("merge", help="merge learners' zips or folders into build/class/")
    m.add_argument("sources", nargs="+", type=Path)
    m.add_argument("--out", type=Path, default=ROOT / "build" / "class")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            print(pack(args.name, args.results or config.results_dir(), args.out))
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
