"""Count a run's verdicts: how many differences of 10 % or more a run called "within noise", a tie or "no verdict".

``make run`` gives every notebook its own log, build/verdicts/NN_name.jsonl (``LABKIT_VERDICT_LOG``:
``labkit.core.verdict`` appends every ``compare()`` and ``against()`` verdict there, one JSON line each), then

    python -m bench.verdicts build/verdicts/*.jsonl     (one file per notebook: its name is the row's name)

A row counts log lines: a verdict computed twice (a cell and its takeaway) counts twice.

prints one JSON document: per file and in all, the verdicts by kind, the differences of 10 % or more (either way)
by kind, and how many of those were called noise, a tie or no verdict, each count beside how many of them had
two or more samples a side. "faster" on a difference under the 2 % floor is counted too: it must be 0.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

from labkit.core import verdict

BIG = 0.10  # a difference of 10 % or more, either way: |ln ratio| ≥ ln 1.1
UNCALLED = (verdict.NOISE, verdict.TIED, verdict.NO_VERDICT)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def count(rows: list[dict]) -> dict:
    big = [r for r in rows if abs(math.log(r["ratio"])) >= math.log1p(BIG)]
    uncalled = [r for r in big if r["kind"] in UNCALLED]
    small_called = [r for r in rows if r["kind"] in (verdict.BETTER, verdict.WORSE)
                    and abs(math.log(r["ratio"])) < math.log1p(verdict.TOLERANCE)]
    return {"verdicts": len(rows), "by_kind": dict(Counter(r["kind"] for r in rows)),
            "big": len(big), "big_by_kind": dict(Counter(r["kind"] for r in big)),
            "big_uncalled": len(uncalled), "big_uncalled_two_plus": sum(r["n"] >= 2 for r in uncalled),
            "called_under_floor": len(small_called)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    every = {p.stem: read(p) for p in args.logs}
    out = {"per_file": {name: count(rows) for name, rows in every.items()},
           "all": count([r for rows in every.values() for r in rows])}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
