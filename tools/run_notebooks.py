"""Execute every notebook headless, in order, and write a summary (``make run``).

Each notebooks/NN_*.ipynb runs in a fresh kernel with the notebook's folder as working
directory (as nbmake does). The executed copy goes to build/executed/, and
build/summary.json + build/summary.html list per notebook: status, wall time, the slowest
cells and the key results read from the results/*.json files the notebook saved.
A failing notebook is reported with its failing cell (index, source excerpt, error) and
the others still run; the exit status is 1 when any notebook failed.

    python -m tools.run_notebooks                 # all notebooks (LABKIT_QUICK=1 for quick mode)
    python -m tools.run_notebooks --only 00 03    # a subset, by number or name
    python -m tools.run_notebooks --only 07 09 --reference   # full mode; results become data/reference/*.json
    python -m tools.run_notebooks --solutions     # exercise cells replaced by notebooks/solutions/: all "correct"

Exercises: every check cell prints one verdict line (``labkit.lessons.exercises``). As shipped, each must say
"not attempted" (a notebook that says "correct" ships a solution); with ``--solutions`` each must say
"correct". Anything else fails that notebook. The checks also write the run's progress record,
build/progress.json (``LABKIT_PROGRESS``: a headless run never touches the learner's own record); after the run,
``python -m labkit progress`` on it must show no exercise done as shipped and every one done with ``--solutions``.

Verdicts: each notebook's kernel appends every verdict it reaches to build/verdicts/NN_name.jsonl
(``LABKIT_VERDICT_LOG``); ``python -m bench.verdicts build/verdicts/*.jsonl`` counts them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import nbformat
import zmq
from jupyter_client.kernelspec import NoSuchKernel, find_kernel_specs
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from traitlets import default

from labkit.core import config, results, verdict
from labkit.lessons import exercises
from labkit.lessons.exercises import progress
from tools import cells
from tools.summary import ANSI, ROOT, FailedCell, NotebookRun, key_results, output_words, slowest, write_summary

NOTEBOOKS_DIR = ROOT / "notebooks"
SOLUTIONS_DIR = NOTEBOOKS_DIR / "solutions"
BUILD_DIR = ROOT / "build"
EXCERPT_LINES = 8
EXCERPT_CHARS = 600
REFERENCE_ENV = ("LABKIT_MODEL", "LABKIT_DEVICE", "LABKIT_VLLM_LIVE")  # settings a reference's command names when set


def discover(only: list[str] | None = None, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """notebooks/*.ipynb in order; ``only`` keeps those whose name is or starts with an entry."""
    found = sorted(p for p in notebooks_dir.glob("*.ipynb") if not p.name.startswith("."))
    if not only:
        return found
    picked = [p for p in found if any(p.stem == o or p.stem.startswith(o) for o in only)]
    unknown = [o for o in only if not any(p.stem == o or p.stem.startswith(o) for p in found)]
    if unknown:
        raise ValueError(f"no notebook matches {unknown}; available: {[p.stem for p in found]}")
    return picked


def _excerpt(source: str) -> str:
    lines = source.splitlines()
    text = "\n".join(lines[:EXCERPT_LINES])
    if len(lines) > EXCERPT_LINES:
        text += f"\n… ({len(lines) - EXCERPT_LINES} more lines)"
    return text[:EXCERPT_CHARS]


def _failed_cell(nb: nbformat.NotebookNode, index: int, fallback_error: str) -> FailedCell:
    """The failing cell's excerpt and error, read from its error output when it has one
    (index -1: no cell had started, the kernel itself failed)."""
    if index < 0:
        return FailedCell(index=-1, source_excerpt="(no cell started)", error=fallback_error[:1000], traceback_tail="")
    cell = nb.cells[index]
    error, tb = fallback_error, ""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            error = f"{out.get('ename', '?')}: {out.get('evalue', '')}"
            tb = ANSI.sub("", "\n".join(out.get("traceback", [])))
    tail = "\n".join(tb.splitlines()[-12:])
    return FailedCell(index=index, source_excerpt=_excerpt(cell.source), error=error[:1000], traceback_tail=tail)


def exercise_ids(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, exercise id) of every exercise cell, found by its tag."""
    return [(i, nb.cells[i].metadata["labkit"]["exercise"]) for i in cells.tagged(nb, "exercise")]


def exercise_verdicts(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Exercise id -> the status its check cell printed (``labkit.lessons.exercises`` verdict lines)."""
    found: dict[str, str] = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                m = exercises.LINE.match(line)
                if m:
                    found[m["id"]] = m["status"]
    return found


def with_solutions(nb: nbformat.NotebookNode, solutions_file: Path) -> nbformat.NotebookNode:
    """The notebook with each exercise cell's placeholder replaced by its solution."""
    if not solutions_file.is_file():
        raise FileNotFoundError(f"no solutions file {solutions_file} for this notebook's exercises")
    solved = dict(cells.named(solutions_file.read_text(encoding="utf-8")))
    for i, ex_id in exercise_ids(nb):
        if ex_id not in solved:
            raise KeyError(f"{solutions_file.name} has no cell '# %% exercise {ex_id}'")
        nb.cells[i].source = solved[ex_id]
    return nb


def check_exercises(nb: nbformat.NotebookNode, expected: str) -> FailedCell | None:
    """Every exercise's check printed ``expected`` ('not attempted' as shipped, 'correct' with solutions)."""
    verdicts = exercise_verdicts(nb)
    wrong = {ex_id: verdicts.get(ex_id, "no verdict printed") for _, ex_id in exercise_ids(nb)
             if verdicts.get(ex_id) != expected}
    if not wrong:
        return None
    index = next(i for i, ex_id in exercise_ids(nb) if ex_id in wrong)
    listing = ", ".join(f"{k}: {v}" for k, v in wrong.items())
    return _failed_cell(nb, index, f"ExerciseCheck: expected every check to say {expected!r}; got {listing}")


class QuietKernelManager(AsyncKernelManager):
    """A kernel that is not on plain TCP, so ipykernel (7+) does not warn at every start that it
    is "running over TCP without encryption": CurveZMQ-encrypted TCP when libzmq has CurveZMQ and
    the kernelspec declares ``supported_encryption: ["curve"]`` (ipykernel's own spec does), else
    IPC sockets in Jupyter's runtime folder (POSIX), else plain TCP as before."""

    def _curve(self) -> bool:
        try:
            spec = self.kernel_spec
        except NoSuchKernel:  # reported when the kernel starts; cleaning up must not raise it again
            return False
        encryption = (getattr(spec, "metadata", None) or {}).get("supported_encryption") or []
        encryption = [encryption] if isinstance(encryption, str) else encryption
        return zmq.has("curve") and "curve" in {str(e).strip().lower() for e in encryption}

    @default("transport_encryption")
    def _transport_encryption_default(self) -> str:
        return "auto" if self._curve() else "disabled"

    @default("transport")
    def _transport_default(self) -> str:
        return "tcp" if self._curve() or os.name == "nt" else "ipc"

    def _ip_default(self) -> str:
        if self.transport == "ipc":  # a socket-file prefix; jupyter_client's default is relative to the cwd
            folder = Path(jupyter_runtime_dir())
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder / f"labkit-kernel-{uuid.uuid4().hex[:12]}-ipc")
        return super()._ip_default()


def run_notebook(path: Path, executed_dir: Path, timeout_s: int, kernel_name: str | None = None,
                 solutions: bool = False) -> NotebookRun:
    """Execute one notebook in a fresh kernel (the one its metadata names, as nbmake does);
    never raises for a failure inside the notebook or its kernel. ``solutions``: run it with the
    exercise cells replaced by notebooks/solutions/<name>.py."""
    nb = nbformat.read(path, as_version=4)
    if solutions and exercise_ids(nb):
        nb = with_solutions(nb, SOLUTIONS_DIR / f"{path.stem}.py")
    kernel_name = kernel_name or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    current = {"index": -1}

    def on_cell_start(cell: nbformat.NotebookNode, cell_index: int) -> None:
        current["index"] = cell_index

    client = NotebookClient(nb, timeout=timeout_s, kernel_name=kernel_name, allow_errors=False,
                            record_timing=True, resources={"metadata": {"path": str(path.parent)}},
                            on_cell_start=on_cell_start, kernel_manager_class=QuietKernelManager)
    status, failed = "ok", None
    started_epoch_s = time.time()
    # the kernel process's own stderr (C++ libraries writing to fd 2: the profiler's USDT lines, oneDNN
    # notes) goes to a log beside the executed notebook instead of every `make run`'s terminal; what a
    # cell prints, warnings included, stays in the notebook as before
    executed_dir.mkdir(parents=True, exist_ok=True)
    kernel_log = executed_dir / f"{path.stem}.kernel.log"
    t0 = time.perf_counter()
    try:
        with kernel_log.open("wb") as log:
            client.execute(stderr=log)
    except CellExecutionError as exc:
        status = "failed"
        failed = _failed_cell(nb, current["index"], str(exc).strip().splitlines()[-1] if str(exc).strip() else "error")
    except CellTimeoutError:
        status = "timeout"
        failed = _failed_cell(nb, current["index"], f"CellTimeoutError: cell ran longer than {timeout_s} s "
                                                    "(raise NB_TIMEOUT, or use LABKIT_QUICK=1)")
    except DeadKernelError as exc:
        status = "kernel died"
        failed = _failed_cell(nb, current["index"], f"DeadKernelError: {exc} (out of memory? the kernel's own "
                                                    f"output is in {kernel_log})")
    except NoSuchKernel as exc:
        status = "kernel error"
        failed = _failed_cell(nb, -1, f"NoSuchKernel: {exc}; installed kernels: {sorted(find_kernel_specs())} "
                                      "(start from the labkit .venv, e.g. `make run`)")
    except RuntimeError as exc:  # the kernel did not start or stopped answering (nbclient/jupyter_client)
        status = "kernel error"
        failed = _failed_cell(nb, current["index"], f"RuntimeError: {exc} (is ipykernel installed in "
                                                            f"this environment? `{sys.executable} -m ipykernel --version`)")
    wall_s = time.perf_counter() - t0
    if status == "ok":
        failed = check_exercises(nb, "correct" if solutions else "not attempted")
        status = "exercise check failed" if failed else status
    finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    executed_dir.mkdir(parents=True, exist_ok=True)
    executed = executed_dir / path.name
    nbformat.write(nb, executed)
    return NotebookRun(
        name=path.stem, path=str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
        executed_path=str(executed.relative_to(ROOT) if executed.is_relative_to(ROOT) else executed),
        status=status, wall_s=round(wall_s, 2), quick=config.quick(), finished_at=finished_at, n_cells=len(nb.cells),
        n_code_cells=sum(c.cell_type == "code" for c in nb.cells), slowest_cells=slowest(nb),
        failed_cell=failed, results=key_results(path.stem, started_epoch_s), exercises=exercise_verdicts(nb),
        output_words=output_words(nb))


def save_reference(name: str, command: str, reference_dir: Path | None = None, sections: list[str] | None = None) -> Path:
    """Copy ``results/<name>.json`` into data/reference/ (``<name>.<gpu>.json`` for a GPU run), its
    provenance naming ``command`` (the kernel's own argv says nothing about how the notebook was run).

    With ``sections``, only those are copied into the reference already there: each name's rows (a results
    section) and its notes entry, where the run has them, each recorded with this run's provenance under
    ``notes["section_env"]``; the rest of the reference stays as it was (sections that need software this
    machine lacks keep the run that had it)."""
    res = results.as_reference(results.load(config.results_dir() / f"{name}.json"))  # rows name their machine
    res.env["command"] = command
    path = (reference_dir or results.reference_dir()) / f"{results.reference_name(name, res.env)}.json"
    if not sections:
        return res.save(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no reference to copy sections into; run --reference without --sections first")
    ref = results.load(path)
    found = [s for s in sections if res.section(s) or s in res.notes]
    if not found:
        raise ValueError(f"{name}: this run has none of the sections {sections}; nothing copied")
    for section in found:
        if res.section(section):
            ref.replace(section, [{k: v for k, v in r.items() if k != "section"} for r in res.section(section)])
        if section in res.notes:
            ref.notes[section] = res.notes[section]
        ref.notes.setdefault("section_env", {})[section] = res.env
    return ref.save(path)


def progress_check(runs: list[NotebookRun], progress_file: Path, solutions: bool) -> tuple[str, bool]:
    """The run's progress record against what the run must leave: (one line, whether it is right)."""
    record = progress.load(progress_file)["exercises"]
    ids = sorted(ex for r in runs if r.status == "ok" for ex in r.exercises)
    done = [i for i in ids if record.get(i, {}).get("status") == "correct"]
    ok = len(done) == len(ids) if solutions else not done
    want = "every one" if solutions else "none"
    return (f"progress ({progress_file}): {len(done)} of {len(ids)} exercises done; {want} expected"
            + ("" if ok else f" — wrong: {sorted(set(ids) - set(done)) if solutions else done}"), ok)


def run_all(paths: list[Path], build_dir: Path = BUILD_DIR, timeout_s: int = 900,
            solutions: bool = False) -> dict[str, Any]:
    runs = []
    progress_file = (build_dir / "progress.json").resolve()
    progress_file.unlink(missing_ok=True)
    os.environ["LABKIT_PROGRESS"] = str(progress_file)  # the kernels inherit it
    os.environ["LABKIT_HEADLESS"] = "1"  # no progress bars: a saved notebook would keep them at 0 %
    verdict_dir = (build_dir / "verdicts").resolve()
    verdict_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem} …", flush=True)
        log = verdict_dir / f"{path.stem}.jsonl"
        log.unlink(missing_ok=True)
        os.environ[verdict.LOG_ENV] = str(log)  # this notebook's kernel inherits it
        run = run_notebook(path, build_dir / "executed", timeout_s, solutions=solutions)
        runs.append(run)
        print(f"[{i}/{len(paths)}] {path.stem}: {run.status} in {run.wall_s:.1f} s", flush=True)
        if run.failed_cell:
            fc = run.failed_cell
            print(f"    failing cell {fc.index}: {fc.error}\n" + "\n".join(f"    | {l}" for l in fc.source_excerpt.splitlines()),
                  flush=True)
    summary = write_summary(runs, time.perf_counter() - t0, build_dir)
    summary["progress_line"], summary["progress_ok"] = progress_check(runs, progress_file, solutions)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="notebook names or number prefixes (default: all)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one cell may run (default 900)")
    ap.add_argument("--build-dir", type=Path, default=BUILD_DIR, help="where executed/ and summary.* go")
    ap.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR)
    ap.add_argument("--reference", action="store_true",
                    help="full mode only: copy each passing notebook's results/<name>.json to data/reference/")
    ap.add_argument("--solutions", action="store_true",
                    help="replace exercise cells with notebooks/solutions/: every check must say 'correct'")
    ap.add_argument("--sections", nargs="+", default=None,
                    help="with --reference: copy only these sections (rows and notes entries) into the reference "
                         "already there, each with this run's provenance")
    args = ap.parse_args(argv)
    if args.sections and not args.reference:
        ap.error("--sections says which sections --reference copies: add --reference")
    if args.solutions and args.reference:
        ap.error("--solutions and --reference do not mix: reference results come from the notebooks as shipped")
    if args.reference and config.quick():
        ap.error("--reference records full-mode runs: unset LABKIT_QUICK")
    if args.timeout <= 0:
        ap.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    try:
        paths = discover(args.only, args.notebooks_dir)
    except ValueError as exc:
        ap.error(str(exc))
    if not paths:
        ap.error(f"no notebooks in {args.notebooks_dir}")
    print(f"running {len(paths)} notebooks ({'quick' if config.quick() else 'full'} mode; "
          f"LABKIT_QUICK=1 for quick)", flush=True)
    summary = run_all(paths, args.build_dir, args.timeout, solutions=args.solutions)
    ran = {p.stem for p in paths}
    failed = [n["name"] for n in summary["notebooks"] if n["name"] in ran and n["status"] != "ok"]
    print(summary["progress_line"])
    if not summary["progress_ok"]:
        failed.append("progress record")
    print(f"summary: {args.build_dir / 'summary.html'} · {len(ran) - len(failed)}/{len(ran)} passed "
          f"in {summary['run_wall_s']:.1f} s" + (f" · failed: {', '.join(failed)}" if failed else ""))
    if args.reference:
        settings = [f"{k}={os.environ[k]}" for k in REFERENCE_ENV if os.environ.get(k)]  # what changed the measurement
        command = " ".join([*settings, "python -m tools.run_notebooks --reference --only", *sorted(ran - set(failed))])
        command += " --sections " + " ".join(args.sections) if args.sections else ""
        for name in sorted(ran - set(failed)):
            try:
                print("reference:", save_reference(name, command, sections=args.sections))
            except (FileNotFoundError, ValueError) as exc:
                print(f"reference: {name}: nothing copied ({exc})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
