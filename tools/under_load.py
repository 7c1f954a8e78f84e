"""Run a command beside a deliberate CPU hog: one busy process per core, stopped when the command ends.

    python -m tools.under_load -- make run NOTEBOOKS="01 02 03 06 07"
    python -m tools.under_load --hogs 1 -- make test-browser

What a workshop laptop does to the lab in milder form (a browser, a video call): the notebooks' load lines
say BUSY, and their verdicts must answer "within noise" or "implausible — rerun" rather than teach noise.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HOG = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name the command to run after --, e.g. -- make run NOTEBOOKS=\"01 06\"")
    if args.hogs < 1:
        ap.error(f"--hogs {args.hogs}: at least one busy process")
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    print(f"{len(hogs)} busy processes running beside: {' '.join(command)}", file=sys.stderr)
    try:
        return subprocess.call(command)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


if __name__ == "__main__":
    sys.exit(main())
